"""Every command and option of ``approvald`` says what it does in ``--help``."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from approvald.bot.cli import build_parser, root


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


def test_the_command_table_is_what_the_groups_add() -> None:
    """``approvald --help`` lists the commands from the root's table without importing the
    groups (issue 45: the hook ran for a second importing them all); the table names
    each command, the group that adds it and its help line, as the groups themselves do."""
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    added = []
    for group in root.groups():
        scratch = argparse.ArgumentParser().add_subparsers()
        group.register(scratch)
        added += [(name, group.__name__.rsplit(".", 1)[1], helps[name])
                  for name in scratch.choices]
    assert tuple(added) == root.COMMANDS


@pytest.mark.slow  # a fresh process: what it imports is the point
def test_running_one_command_imports_only_its_group() -> None:
    """The parser built for one command imports that command's group and none of the
    others (what the hook's process pays for), and its --help lists every command."""
    code = ("import sys; from approvald.bot.cli import root; root.build_parser('hook'); "
            "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('approvald.bot.cli.')), "
            "sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'pydantic', "
            "'aiohttp', 'asyncio', 'logging', 'dataclasses', 'ssl'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["['argtypes',", "'hook',", "'root']", "[]"]
    menu = root.build_parser("nothing-such").format_help()
    assert all(name in menu for name, _, _ in root.COMMANDS)


def test_help_that_points_elsewhere_names_a_page_that_exists() -> None:
    """Issue 48 item 8: `--json` said "see the README", where no document's keys are
    listed; a help text that sends the reader elsewhere names a docs page that exists."""
    top = Path(__file__).resolve().parents[2]
    texts = [(where, a.help or "") for where, a in walk(build_parser())]
    readme = [f"{where}: {text}" for where, text in texts if "README" in text]
    assert readme == []
    pages = {page for _, text in texts for page in re.findall(r"docs/[\w/.-]+\.md", text)}
    assert "docs/reference/json-documents.md" in pages
    assert sorted(p for p in pages if not (top / p).is_file()) == []
