"""The ``approvald`` command line: the root parser built from the command groups, and
``main``, which runs one command in this process and returns its exit code.

User mistakes (unknown agent or run, bad URL, bad flag) and an environment that refuses
(a database that cannot be reached, a port in use) are one line on stderr and a non-zero
exit, never a traceback. Exit codes: 0 ok (a run completed or is waiting for approval),
1 a run failed or was cancelled, 2 usage, input or configuration error, 3 a run needs
attention, 4 a decision was refused, 5 the audit log does not verify, 6 the run goes on
without this command (another process is advancing it, or it waits for a rate limit or
an outage to pass; `approvald serve` resumes it), 70 an internal error (a bug). Output
whose reader has gone (``| head -1``) is dropped quietly.

``main`` never calls ``sys.exit`` (only ``python -m approvald.bot.cli`` and the console
script, which pass its return value to it), so a test or a program can run a command
in-process and read its exit code, stdout and stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import IO, Any, NoReturn

from approvald.bot.cli import (
    approvals,
    audit,
    deploy,
    evals,
    hook,
    keys,
    outbox,
    runs,
    serve,
    standing,
    tokens,
)
from approvald.bot.cli.common import Handler, UsageError
from approvald.bot.config import load_settings
from approvald.bot.wiring import check_environment
from approvald.runtime.errors import ApprovaldError, DecisionRefused
from approvald.runtime.sealing import OneLineRefusals
from approvald.runtime.standing import StandingRefused

# every command group: a module with ``register(subparsers) -> None`` (in ``--help`` order)
GROUPS: tuple[ModuleType, ...] = (runs, evals, approvals, standing, audit, outbox, tokens,
                                  keys, deploy, hook, serve)

# loggers whose levels a command sets for itself (and ``main`` puts back)
QUIETED = ("alembic", "apscheduler", "approvald.outcomes")


class _Exit(Exception):
    """``--help`` and the like are done: exit with ``status`` (instead of ``sys.exit``)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self._print_message(message, sys.stderr)
        raise _Exit(status)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="approvald", description="Durable agent runs with human approval.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


class ClosedPipeSafe:
    """A text stream that goes quiet once its reader has gone (``| head -1``): the command
    finishes what it is doing (a decision, a run) and exits as it would have, its
    remaining output dropped, instead of failing with BrokenPipeError."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return int(self.stream.write(text))
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.gone = True
        # what is still buffered (flushed again at exit) goes nowhere, silently
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command (``argv``, default ``sys.argv[1:]``) on ``sys.stdout`` and
    ``sys.stderr``; every error a user can meet is one line on stderr and an exit code,
    which is returned (never raised as ``SystemExit``)."""
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ClosedPipeSafe(stdout), ClosedPipeSafe(stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = stdout, stderr


def _main(argv: Sequence[str] | None) -> int:
    with ExitStack() as scope:  # the command's logging, kept for its errors' lines too
        try:
            args = build_parser().parse_args(argv)
            settings = load_settings()
            check_environment(settings)
            scope.enter_context(_logging(args.cmd, settings.log_level))
            fn: Handler = args.fn
            code: int = asyncio.run(fn(settings, args))
        except _Exit as exc:
            return exc.status
        except UsageError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        except (DecisionRefused, StandingRefused) as exc:
            print(f"approvald: refused: {exc}", file=sys.stderr)
            return 4
        except ApprovaldError as exc:
            print(f"approvald: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
        except OSError as exc:
            if exc.errno is None:
                return _internal_error(exc)
            # the system refused something (a port in use, a file that cannot be written):
            # the environment, not a bug
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"approvald: {where}{exc.strerror or exc}", file=sys.stderr)
            return 2
        except Exception as exc:
            return _internal_error(exc)
        return code


@contextmanager
def _logging(cmd: str, log_level: str) -> Iterator[None]:
    """Log lines to this command's stderr while it runs (``serve``: at the configured level;
    every other command: warnings and worse, unless DEBUG is asked for), then put the
    logging configuration back as it was."""
    level = log_level if cmd == "serve" or log_level == "DEBUG" else "WARNING"
    root = logging.getLogger()
    before = root.level, {n: logging.getLogger(n).level for n in QUIETED}
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # a value no key of this process opens is told in one line, once a minute, wherever
    # it is met (each poll, each drain, each job would otherwise print a traceback)
    handler.addFilter(OneLineRefusals())
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("alembic", "apscheduler"):  # their INFO lines are not ours to show
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    if cmd != "serve" and level != "DEBUG":
        # every other command prints the outcome of each run it advances: once is enough
        logging.getLogger("approvald.outcomes").setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(before[0])
        for name, was in before[1].items():
            logging.getLogger(name).setLevel(was)


def _internal_error(exc: Exception) -> int:
    """A bug, not a user mistake: say so in one line, log the rest (exit 70)."""
    logging.getLogger("approvald").debug("internal error", exc_info=True)
    first = (str(exc).strip().splitlines() or [""])[0]
    print(f"approvald: internal error: {type(exc).__name__}: {first} "
          "(set APPROVALD_LOG_LEVEL=DEBUG for the traceback)", file=sys.stderr)
    return 70
