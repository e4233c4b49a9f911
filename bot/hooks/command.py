"""``approvald hook``'s commands as processes: Claude Code's command hook (``hook
claude-code``), and its place in Claude Code's settings (``hook install claude-code``,
``hook check claude-code``). :mod:`approvald.bot.cli.hook` parses their arguments.

The hook runs for every tool call, so importing this costs next to nothing: the process
starts its clock and its watchdog (:mod:`.process`) first, then reads the event (bytes,
decoded as UTF-8 whatever the locale says), then either hands it to a running ``serve``
(``--serve URL``, :mod:`.handoff`: the standard library only, milliseconds) or decides
here (:mod:`approvald.bot.claude_code`: importing the engine and opening the database).
Whatever happens, it answers within ``--wait`` plus
:data:`~approvald.bot.claude_code_contract.MARGIN`: the decision, or a deny saying why;
never an allow it did not decide, never an exit status Claude Code reads as "go ahead".
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from approvald.bot.claude_code_contract import (
    DEFAULT_WAIT,
    HTTP_MARGIN,
    MARGIN,
    PRE,
    HookEvent,
    HookEventError,
    fail_closed,
)
from approvald.bot.hooks.process import Answer, read_event

if TYPE_CHECKING:
    from approvald.bot.config import Settings
    from approvald.runtime import Engine

__all__ = ["DEFAULT_WAIT", "MARGIN", "WithEngine", "check", "claude_code", "install"]

# an event after the call that could not be recorded: a line on stderr, and this status
# (Claude Code shows it; the call has run already)
NOT_RECORDED = 1
# how the hook runs its decision with an engine (the command line's ``with_engine``:
# open the database, build the engine, note the policy in force when ``acts``, close)
WithEngine = Callable[["Settings", Callable[["Engine"], Awaitable[int]], bool],
                      Awaitable[int]]


def install(*, scope: str | None, wait: float, requested_by: str | None,
            serve: str | None, http: str | None) -> int:
    """``hook install claude-code``: merge approvald's hooks into the settings file of
    ``scope`` (``project``, the default; ``local``; ``user``); the exit status (2, with a
    line on stderr, for what it cannot do)."""
    from approvald.bot.hooks import settings_file as sf
    from approvald.bot.hooks.handoff import HandoffFailed, Serve
    from approvald.runtime import InvalidIdentity, normalize_user_id

    path = {"user": sf.user_file(), "local": sf.project_files()[1]}.get(
        scope or "", sf.project_files()[0])
    hooks = sf.Hooks(wait=wait, requested_by=requested_by, serve=serve, http=http)
    try:
        if requested_by:
            normalize_user_id(requested_by)
        if http or serve:
            Serve.parse(http or serve or "", token="-")
        before = sf.load(path)
        after = sf.merge(before, hooks)
        if after == before:
            print(f"approvald: {path} has approvald's hooks already; nothing changed")
            return 0
        sf.write(path, after)
    except (InvalidIdentity, HandoffFailed, sf.SettingsError) as exc:
        said = str(exc).replace("--serve", "--http") if http else str(exc)
        flag = "--requested-by: " if isinstance(exc, InvalidIdentity) else ""
        print(f"approvald: {flag}{said}", file=sys.stderr)
        return 2
    print(f"approvald: wrote approvald's hooks into {path}:")
    print(json.dumps(hooks.all(), indent=2, ensure_ascii=False))
    if http or serve:
        print(f"Set {sf.TOKEN_VARIABLE} in the environment Claude Code runs in (a token made "
              "with `approvald tokens create NAME --face hook:claude-code --requested-by "
              "U…`).")
    return 0


def check(*, scope: str | None) -> int:
    """``hook check claude-code``: what is wrong with the installed hooks in the settings
    of ``scope`` (``user``, ``project``; default: both), exit 1 if anything is."""
    from approvald.bot.hooks import settings_file as sf

    paths = {"user": [sf.user_file()], "project": list(sf.project_files())}.get(
        scope or "", [sf.user_file(), *sf.project_files()])
    try:
        files = [(path, sf.load(path)) for path in paths if path.exists()]
    except sf.SettingsError as exc:
        print(f"approvald: {exc}", file=sys.stderr)
        return 1
    print("approvald: Claude Code's settings read: "
          + (", ".join(str(p) for p, _ in files) or f"none ({', '.join(map(str, paths))})"))
    findings = sf.check(files)
    for f in findings:
        print(f"{'problem' if f.problem else 'ok'}: {f.text}")
    return 1 if any(f.problem for f in findings) else 0


def claude_code(*, wait: float, serve: str | None, requested_by: str | None,
                own_process: bool, with_engine: WithEngine) -> int:
    """The hook's process (see the module docstring); its exit status. ``own_process``:
    run as the console script (the watchdog may end the process)."""
    a = _Options(wait, serve, requested_by, with_engine)
    started = time.monotonic()
    answer = Answer(deadline=started + wait + MARGIN, fallback=json.dumps(fail_closed(
        f"no decision within {wait + MARGIN:g} s (--wait {wait:g} + {MARGIN:g}); is the "
        "database (or serve) answering?")))
    answer.watch(own_process=own_process)
    kind = PRE  # until the event says otherwise: an event it cannot read is denied
    try:
        raw = read_event()
        event = HookEvent.read(raw)
        kind = event.event
        if kind != PRE:  # nothing to decide: record what ran, in the margin's time
            answer.otherwise("approvald: the call's result was not recorded: no answer "
                             f"within {MARGIN:g} s", code=NOT_RECORDED, to_stderr=True)
            answer.sooner(started + MARGIN)
        if a.serve:
            return _hand_to_serve(a, a.serve, raw, event, answer, started)
        return _decide_here(a, event, answer, started)
    except BaseException as exc:  # fail closed: whatever went wrong is a deny
        import logging

        logging.getLogger("approvald.hook").debug("the hook could not decide", exc_info=True)
        return _undecided(answer, kind, str(exc) or type(exc).__name__)


def _undecided(answer: Answer, kind: str, why: str) -> int:
    """Say that the event was not decided (a deny) or not recorded; the exit status."""
    if kind == PRE:
        answer.give(json.dumps(fail_closed(why)))
        return 0
    if answer.give(f"approvald: the call's result was not recorded: {why}",
                   stream=sys.stderr, code=NOT_RECORDED):
        return NOT_RECORDED
    return 0  # it was, before what failed after


def _hand_to_serve(a: _Options, url: str, raw: bytes, event: HookEvent, answer: Answer,
                   started: float) -> int:
    from approvald.bot.hooks.handoff import Serve  # only on this path

    serve = Serve.parse(url)
    # serve answers within the wait it is given plus its own margin: it is given what is
    # left of the hook's wait, and not answering by then (a second more) is a deny
    wait = max(0.0, started + a.wait - time.monotonic())
    deadline = min(answer.deadline - 0.5, time.monotonic() + wait + HTTP_MARGIN + 1.0)
    said = serve.post(raw, kind=event.event, wait=wait, deadline=deadline)
    answer.give(json.dumps(said) if said is not None else "")
    return 0


def _decide_here(a: _Options, event: HookEvent, answer: Answer,
                 started: float) -> int:
    import asyncio  # the decision path's imports: only on it

    from approvald.bot.config import load_settings
    from approvald.bot.wiring import check_environment

    settings = load_settings()
    check_environment(settings)
    requested_by = requester(settings, a.requested_by)

    async def run() -> int:
        work = asyncio.ensure_future(_decide(settings, a, event, requested_by, answer,
                                             started))
        # a little before the watchdog, so that the deny comes from here
        done, _ = await asyncio.wait({work}, timeout=answer.deadline - time.monotonic() - 0.5)
        if done:
            return work.result()
        # stuck where a cancellation does not reach (a statement waiting in the database
        # driver's thread): answer now; the watchdog ends the process if tidying up hangs
        work.cancel()
        budget = f"--wait {a.wait:g} + {MARGIN:g}" if event.event == PRE else "its margin"
        return _undecided(answer, event.event, f"no answer within "
                          f"{answer.deadline - started:g} s ({budget}); is the database "
                          "answering?")

    return asyncio.run(run())


async def _decide(settings: Settings, a: _Options, event: HookEvent,
                  requested_by: str, answer: Answer, started: float) -> int:
    from approvald.bot.claude_code import ClaudeCodeHook

    pre = event.event == PRE

    async def decide(engine: Any) -> int:
        hook = ClaudeCodeHook(engine, event, requested_by=requested_by)
        if pre:
            waited = time.monotonic() - started
            answer.give(json.dumps(await hook.pre_tool_use(wait=max(0.0, a.wait - waited))))
        else:
            await hook.post_tool_use()
            answer.give("")
        return 0

    return await a.with_engine(settings, decide, pre)


def requester(s: Settings, given: str | None) -> str:
    """``--requested-by``, else the Slack user APPROVALD_SLACK_USERS maps the local user
    to; neither: refused (the hook then denies, saying so)."""
    import getpass

    from approvald.runtime import InvalidIdentity, normalize_user_id

    if given:
        try:
            return normalize_user_id(given)
        except InvalidIdentity as exc:
            raise HookEventError(f"--requested-by: {exc}") from None
    local = getpass.getuser()
    found = s.slack_user_of(local)
    if found is None:
        raise HookEventError(f"no Slack user for the local user {local!r}: give "
                             f"--requested-by U…, or map it in APPROVALD_SLACK_USERS "
                             f"({local}=U…)")
    return found


class _Options:
    """What ``hook claude-code`` was given."""

    def __init__(self, wait: float, serve: str | None, requested_by: str | None,
                 with_engine: WithEngine) -> None:
        self.wait, self.serve, self.requested_by = wait, serve, requested_by
        self.with_engine = with_engine
