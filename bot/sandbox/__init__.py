"""A local stand-in for Slack, for tests and demos that must never reach slack.com.

- :class:`SlackEmulator` serves the Web API methods approvald uses, Socket Mode and
  response URLs, with fault injection and a record of every call.
- :class:`SlackClientSim` plays Slack towards the app: signed button clicks, modal
  submissions, slash commands and events.

``approvald sandbox`` (:mod:`bot.sandbox.workspace`) runs the emulator, ``serve`` and a page
that shows the workspace in a browser (:mod:`bot.sandbox.web`, drawn by
:mod:`bot.sandbox.render`, kept across restarts by :mod:`bot.sandbox.persist`).
"""

from approvald.bot.sandbox.client import AppResponse, SlackClientSim
from approvald.bot.sandbox.hooks import ResponseUrlPost
from approvald.bot.sandbox.server import Call, SlackEmulator, run_forever
from approvald.bot.sandbox.state import Workspace

__all__ = ["AppResponse", "Call", "ResponseUrlPost", "SlackClientSim", "SlackEmulator",
           "Workspace", "run_forever"]
