"""``approvald hook disable|enable|status claude-code``: the hook's kill switch, by form
(:mod:`approvald.runtime.switches`)."""

from __future__ import annotations

import argparse

from approvald.bot.cli.common import Subparsers, operator, with_engine
from approvald.bot.config import Settings
from approvald.runtime import switches
from approvald.runtime.engine import Engine
from approvald.store.repos.external import SwitchRecord

ASSISTANTS = {"claude-code": switches.HOOK}


def register(hk: Subparsers) -> None:
    """Add ``hook disable``, ``hook enable`` and ``hook status``."""
    for verb, fn, what in (
            ("disable", cmd_disable, "switch the hook off: every call through it is denied, "
                                     "saying so, until it is switched on again (audited)"),
            ("enable", cmd_enable, "switch the hook on again (audited)")):
        p = hk.add_parser(verb, help=what)
        p.add_argument("assistant", choices=sorted(ASSISTANTS))
        forms = p.add_mutually_exclusive_group()
        forms.add_argument("--command", dest="forms", action="store_const",
                           const=["command"], help="only " + switches.COVERS["command"])
        forms.add_argument("--http", dest="forms", action="store_const", const=["http"],
                           help="only " + switches.COVERS["http"] + " (one person's "
                                "token: `approvald tokens revoke NAME`)")
        forms.add_argument("--all", dest="forms", action="store_const",
                           const=list(switches.FORMS), help="both (the default)")
        if verb == "disable":
            p.add_argument("--reason", help="why (told to Claude Code with each denial, "
                                            "and audited)")
        p.set_defaults(fn=fn, forms=None)
    st = hk.add_parser("status", help="which forms of the hook are switched off, by whom "
                                      "and why, and what each covers")
    st.add_argument("assistant", choices=sorted(ASSISTANTS))
    st.set_defaults(fn=cmd_status)


def _forms(a: argparse.Namespace) -> list[str]:
    return list(a.forms or switches.FORMS)


async def cmd_disable(s: Settings, a: argparse.Namespace) -> int:
    async def run(e: Engine) -> int:
        await switches.disable(e.db, e.clock, e.audit, ASSISTANTS[a.assistant], _forms(a),
                               by=operator(), via="cli", reason=a.reason)
        return await _show(e, a.assistant)

    return await with_engine(s, run)


async def cmd_enable(s: Settings, a: argparse.Namespace) -> int:
    async def run(e: Engine) -> int:
        await switches.enable(e.db, e.clock, e.audit, ASSISTANTS[a.assistant], _forms(a),
                              by=operator(), via="cli")
        return await _show(e, a.assistant)

    return await with_engine(s, run)


async def cmd_status(s: Settings, a: argparse.Namespace) -> int:
    return await with_engine(s, lambda e: _show(e, a.assistant))


async def _show(e: Engine, assistant: str) -> int:
    state = await switches.state(e.db, ASSISTANTS[assistant])
    for form, off in state.items():
        print(f"{form:<8} {_state(off)}\n         covers {switches.COVERS[form]}")
    if any(state.values()):
        print(f"A form that is off denies every call, saying so; `approvald hook enable "
              f"{assistant} [--command|--http]` switches it on again.")
    return 0


def _state(off: SwitchRecord | None) -> str:
    if off is None:
        return "on"
    return (f"OFF since {off.off_at:%Y-%m-%d %H:%M} UTC, by {off.off_by}"
            + (f": {off.reason}" if off.reason else ""))
