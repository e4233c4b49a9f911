"""Every command and option of ``approvald`` says what it does in ``--help``."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from approvald.bot.cli import build_parser


def walk(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(command path, action) for every argument and subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{parser.prog} {name}", argparse.Action([], name, help=helps.get(name))
                yield from walk(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield parser.prog, action


def test_every_command_and_option_has_help() -> None:
    found = list(walk(build_parser()))
    missing = [f"{where}: {'/'.join(a.option_strings) or a.dest}" for where, a in found
               if not (a.help or "").strip() or a.help == argparse.SUPPRESS]
    assert missing == []
    # the walk reaches the leaves (approvals' subcommands and their options among them)
    assert {"approvald approvals list", "approvald approvals approve",
            "approvald approvals sweep"} <= {w for w, _ in found}
    assert len(found) > 60


def test_help_that_points_elsewhere_names_a_page_that_exists() -> None:
    """Issue 48 item 8: `--json` said "see the README", where no document's keys are
    listed; a help text that sends the reader elsewhere names a docs page that exists."""
    root = Path(__file__).resolve().parents[2]
    texts = [(where, a.help or "") for where, a in walk(build_parser())]
    readme = [f"{where}: {text}" for where, text in texts if "README" in text]
    assert readme == []
    pages = {page for _, text in texts for page in re.findall(r"docs/[\w/.-]+\.md", text)}
    assert "docs/reference/json-documents.md" in pages
    assert sorted(p for p in pages if not (root / p).is_file()) == []
