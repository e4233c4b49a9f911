"""The Slack face: the bolt app, its listeners, and the cards, views and messages it shows.

It meets the other faces only in the runtime: nothing here imports ``approvald.bot.api``,
``approvald.bot.mcp`` or ``approvald.bot.sandbox``, and they do not import it.
"""
