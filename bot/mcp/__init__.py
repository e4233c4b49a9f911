"""The MCP gateway: ``approvald mcp-proxy`` puts approvald's gate in front of an MCP server.

:mod:`bot.mcp.gateway` turns each tool call into an external request of
:mod:`runtime.runs.external` (no MCP in it); :mod:`bot.mcp.proxy` speaks MCP, with the official
``mcp`` SDK (the ``mcp`` extra), to the client and to the wrapped server;
:mod:`bot.mcp.http` serves gateways over Streamable HTTP; :mod:`bot.mcp.upstream` is the
wrapped server (a session per client request over HTTP), :mod:`bot.mcp.front` what passes
through besides tool calls, :mod:`bot.mcp.relay` what the server sends back during one
request, :mod:`bot.mcp.tasks` the Tasks extension.
"""
