"""The ``approvald`` command line: the root parser built from the command groups, and
``main``, which runs one command in this process and returns its exit code.

User mistakes (unknown agent or run, bad URL, bad flag) and an environment that refuses
(a database that cannot be reached, a port in use) are one line on stderr and a non-zero
exit, never a traceback. Exit codes: 0 ok (a run completed or is waiting for approval),
1 a run failed or was cancelled, 2 usage, input or configuration error, 3 a run needs
attention, 4 a decision was refused, 5 the audit log does not verify (`audit verify`, and
`audit export` of a log that does not: the export is written all the same), 6 the run
goes on without this command (another process is advancing it, or it waits for a rate
limit or an outage to pass; `approvald serve` resumes it), 7 the audit log cannot be
verified here (its entries are keyed and no key was given: nothing is known to be wrong),
8 a policy file replayed against the record (``policy replay``, ``policy check
--against-history``) would run without asking a call a person had denied, redirected or
edited, 70 an internal error (a bug). Output
whose reader has gone (``| head -1``) is dropped quietly.

``main`` never calls ``sys.exit`` (only ``python -m approvald.bot.cli`` and the console
script, which pass its return value to it), so a test or a program can run a command
in-process and read its exit code, stdout and stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import IO, Any, NoReturn

from approvald.bot.cli.argtypes import UsageError

# every top-level command: its name, the command group (a module of this package with
# ``register(subparsers) -> None``) that adds it, and its line in ``approvald --help``, in
# that order. ``main`` imports only the group of the command it runs, so a command (the
# Claude Code hook above all, run for every tool call) does not pay for importing the
# others; tests/unit/test_cli_help.py checks this table against what the groups add.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("db", "runs", "database schema"),
    ("run", "runs", "start a run and advance it until it finishes or pauses"),
    ("runs", "runs", "inspect and cancel runs"),
    ("recover", "runs", "resume runs whose worker died"),
    ("prune", "runs", "delete finished runs' transcripts, execution records and settled "
                      "outbox rows past a horizon, and the web review queue's sign-in rows a "
                      "day after they expired (never an audit entry)"),
    ("trace", "evals", "a run's timeline: model steps, tool calls, approvals and every "
                       "transition, with times"),
    ("eval", "evals", "run journey evals: each task of a dataset, uninterrupted and under "
                      "each interruption, scored"),
    ("approvals", "approvals", "list and decide approval requests"),
    ("standing", "standing", "standing approvals: calls like an approved one run without a "
                             "card for a while"),
    ("audit", "audit", "verify and export the audit log"),
    ("policy", "policy", "check a new policy file against the record of requests"),
    ("insights", "policy", "per tool and per rule: requests, answers, time to decision, who "
                           "decides; shadow rules' records; suggested rules"),
    ("outbox", "outbox", "see and re-drive deliveries to Slack"),
    ("tokens", "tokens", "bearer tokens of the HTTP API (/v1)"),
    ("keys", "keys", "the data key sensitive values are sealed under"),
    ("deploy-check", "deploy", "list waiting calls the agents of a new release could not "
                               "run (exit 1 if any)"),
    ("hook", "hook", "permission hooks of coding assistants"),
    ("serve", "serve", "run the service: Slack app, scheduler, worker, outbox"),
    ("sandbox", "serve", "the whole product locally: Slack in your browser, serve, the demos"),
    ("mcp-proxy", "serve", "serve an MCP server's tools over stdio, each call gated by the "
                           "policy file"),
)

# loggers whose levels a command sets for itself (and ``main`` puts back)
QUIETED = ("alembic", "apscheduler", "approvald.outcomes")


def groups() -> tuple[ModuleType, ...]:
    """Every command group's module, in ``--help`` order (each one imported)."""
    return tuple(_group(name) for name in dict.fromkeys(g for _, g, _ in COMMANDS))


def _group(name: str) -> ModuleType:
    return importlib.import_module(f"approvald.bot.cli.{name}")


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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``approvald``. Without ``command``: every group's commands (the
    reference pages, the help tests). With a command: only the group that adds it is
    imported and registered (what one run needs). With anything else (``--help``, a
    mistake): every command as a name and its help line, no group imported."""
    p = _Parser(prog="approvald", description="Durable agent runs with human approval.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")
    owner = {name: group for name, group, _ in COMMANDS}
    if command in owner:
        _group(owner[command]).register(sub)
        return p
    added: set[str] = set()
    for name, group, line in COMMANDS:
        if command is not None:
            sub.add_parser(name, help=line, add_help=False)
        elif group not in added:
            _group(group).register(sub)
            added.add(group)
    return p


def _command(argv: Sequence[str]) -> str:
    """The command ``argv`` runs (its first word that is not an option), or ""."""
    return next((a for a in argv if not a.startswith("-")), "")


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


def _main(given: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if given is None else given)
    try:
        args = build_parser(_command(argv)).parse_args(argv)
        # the command line of this process (the console script, ``python -m``), not a
        # program's or a test's call: a command may then end the process itself (the
        # hook's watchdog does, to answer in time)
        args.own_process = given is None
    except _Exit as exc:
        return exc.status
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    standalone = getattr(args, "standalone", None)
    if standalone is not None:  # a command that answers whatever approvald's settings say
        try:
            return int(standalone(args))
        except UsageError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        except Exception as exc:
            return _internal_error(exc)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run a command with approvald's settings, on an event loop of its own."""
    import asyncio  # here: a standalone command (the hook) may never need them

    from approvald.bot.config import load_settings
    from approvald.bot.wiring import check_environment
    from approvald.runtime import ApprovaldError, DecisionRefused, StandingRefused

    with ExitStack() as scope:  # the command's logging, kept for its errors' lines too
        try:
            settings = load_settings()
            check_environment(settings)
            scope.enter_context(_logging(args.cmd, settings.log_level))
            # a command's own event loop (serve's: APPROVALD_EVENT_LOOP), else asyncio's
            choose = getattr(args, "loop_factory", None)
            with asyncio.Runner(loop_factory=choose(settings) if choose else None) as runner:
                code: int = runner.run(args.fn(settings, args))
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
    import logging

    # (bot.config, which every such command has loaded, imports it already)
    from approvald.runtime import OneLineRefusals

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
    import logging

    logging.getLogger("approvald").debug("internal error", exc_info=True)
    first = (str(exc).strip().splitlines() or [""])[0]
    print(f"approvald: internal error: {type(exc).__name__}: {first} "
          "(set APPROVALD_LOG_LEVEL=DEBUG for the traceback)", file=sys.stderr)
    return 70
