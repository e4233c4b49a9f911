"""The MCP gateway: ``approvald mcp-proxy`` puts approvald's gate in front of an MCP server.

:mod:`bot.mcp.gateway` turns each tool call into an external request of
:mod:`runtime.external` (no MCP in it); :mod:`bot.mcp.proxy` speaks MCP, with the official
``mcp`` SDK (the ``mcp`` extra), to the client and to the wrapped server.
"""
