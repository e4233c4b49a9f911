"""The ``approvald`` command line: one module per command group (``runs``, ``approvals``,
``standing``, ``audit``, ``outbox``, ``tokens``, ``evals``, ``serve``), each adding its
commands with ``register(subparsers)``; :mod:`.root` builds the parser from them and
runs one command (``main``, the console script's entry point)."""

from approvald.bot.cli.root import build_parser, main

__all__ = ["build_parser", "main"]
