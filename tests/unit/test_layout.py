"""The layout issue 37 asks for: one package per face, faces that meet only in the runtime,
a runtime and store that know nothing of any face, and no import circle inside a face.

Every package under ``bot/`` is a face (issue 47: all eight are checked); what several
faces share lives below them (the runtime) or beside them in a module of ``bot/`` that is
no face (``bot/callers.py``, ``bot/claude_code.py``...), and the faces are put together
only at the top (``bot/serve.py``, ``bot/launch.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACES = ("api", "cli", "evals", "hooks", "mcp", "sandbox", "slack", "web")


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_every_slack_module_lives_in_the_slack_package() -> None:
    flat = {p.stem for p in (ROOT / "bot").glob("*.py")}
    slack_only = {"app", "cards", "handlers", "views", "messages", "texts", "mrkdwn",
                  "delivery", "threads", "slack_body", "directory"}
    assert flat & slack_only == set()


def test_every_package_of_bot_is_a_face_the_layout_checks() -> None:
    packages = {p.parent.name for p in (ROOT / "bot").glob("*/__init__.py")}
    assert packages == set(FACES)


def test_faces_never_import_each_other() -> None:
    crossings = []
    for face in FACES:
        others = tuple(f"approvald.bot.{o}" for o in FACES if o != face)
        for path in (ROOT / "bot" / face).rglob("*.py"):
            for name in imports_of(path):
                if name.startswith(others):
                    crossings.append(f"{path.relative_to(ROOT)} imports {name}")
    assert crossings == []


def test_the_runtime_and_the_store_import_no_face() -> None:
    found = [f"{p.relative_to(ROOT)} imports {n}"
             for part in ("runtime", "store") for p in (ROOT / part).rglob("*.py")
             for n in imports_of(p) if n.startswith("approvald.bot")]
    assert found == []


def test_the_slack_app_and_its_listeners_are_not_a_circle() -> None:
    handlers = imports_of(ROOT / "bot" / "slack" / "handlers.py")
    assert not any(n.startswith("approvald.bot.slack.app") for n in handlers)


def test_every_command_group_registers_the_same_way_and_none_reaches_past_the_engine() -> None:
    """bot/cli/: each group module has ``register(subparsers)``; the root lists them all;
    no group imports the root (no circle); none opens ``engine.db`` (it goes through the
    engine's front door)."""
    import inspect

    from approvald.bot.cli import root

    package = ROOT / "bot" / "cli"
    groups = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__", "root", "common",
                                                        "argtypes"}
    assert {g.__name__.rsplit(".", 1)[1] for g in root.groups()} == groups
    for group in root.groups():
        assert list(inspect.signature(group.register).parameters) == ["sub"], group.__name__
    found = []
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        if path.stem not in ("__init__", "__main__") and any(
                n.startswith("approvald.bot.cli.root") for n in imports_of(path)):
            found.append(f"{path.name} imports the root")
        found += [f"{path.name}:{node.lineno} reads .db"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr == "db"]
    assert found == []


# faces that touch only the engine's verbs and views (issue 47: the others follow, one face
# at a time; `python .ci/architecture.py` counts what is left)
CLOSED = ("api", "mcp")


def test_the_closed_faces_read_no_part_of_the_engine_and_open_no_transaction() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture",
                                                  ROOT / ".ci" / "architecture.py")
    assert spec is not None and spec.loader is not None
    architecture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(architecture)
    inside = tuple(f"bot/{face}/" for face in CLOSED)
    reach = {p: n for p, n in architecture.reach_throughs(architecture.parts()).items()
             if p.startswith(inside)}
    opened = {p: n for p, n in architecture.transactions().items() if p.startswith(inside)}
    assert (reach, opened) == ({}, {})


# the test modules that still open a transaction of their own (issue 47, item 6): the rest
# read and forge rows through ``tests.helpers.Rows``; a new test does too, so this only
# goes down as modules move over
OWN_TRANSACTIONS = 93


def test_tests_reach_the_database_through_the_one_helper() -> None:
    import re

    opens = re.compile(r"\.(read|write)\((snapshot=True)?\) as tx|\.connection\(\) as conn")
    own = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                 if opens.search(p.read_text()))
    assert len(own) <= OWN_TRANSACTIONS, (
        f"{len(own)} test modules open a transaction themselves (at most "
        f"{OWN_TRANSACTIONS}): read and forge rows through tests.helpers.Rows instead")
    assert "tests/unit/test_webhook_outbox.py" not in own
