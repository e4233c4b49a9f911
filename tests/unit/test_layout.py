"""The layout issue 37 asks for: one package per face, faces that meet only in the runtime,
a runtime and store that know nothing of any face, and no import circle inside a face.

Every package under ``bot/`` is a face (issue 47: all eight are checked); what several
faces share lives below them (the runtime) or beside them in a module of ``bot/`` that is
no face (``bot/claude_code.py``...), and the faces are put together
only at the top (``bot/serve.py``, ``bot/launch.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ci_architecture

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
    for flow in ("handlers", "listeners", "decisions", "standing", "batch", "home"):
        found = imports_of(ROOT / "bot" / "slack" / f"{flow}.py")
        assert not any(n.startswith("approvald.bot.slack.app") for n in found), flow


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


# issue 47: no face reads the engine's parts or opens a transaction; everything outside the
# face packages (serve, launch, metrics, wiring, claude_code...) is held to it too.


def test_no_face_reads_a_part_of_the_engine_or_opens_a_transaction() -> None:
    architecture = ci_architecture()
    reach = dict(architecture.reach_throughs(architecture.parts()))
    opened = dict(architecture.transactions())
    assert (reach, opened) == ({}, {})


def test_the_count_sees_a_reach_through_and_a_transaction(tmp_path: Path) -> None:
    """The check above cannot pass by counting nothing: a face module that reads
    ``engine.db`` (or a private ``engine._parts``) and opens a read is counted, in a face
    package and outside one."""
    architecture = ci_architecture()
    parts = architecture.parts()
    for where in ("web", None):
        bot = tmp_path / str(where) / "bot"
        folder = bot / where if where else bot
        folder.mkdir(parents=True)
        (folder / "face.py").write_text(
            "async def show(engine):\n"
            "    async with engine.db.read() as tx:\n"
            "        return engine.decider, engine._parts, tx\n")
        architecture.BOT, root = bot, architecture.ROOT
        architecture.ROOT = bot.parent
        try:
            reach = architecture.reach_throughs(parts)
            opened = architecture.transactions()
        finally:
            architecture.BOT, architecture.ROOT = ROOT / "bot", root
        assert sum(reach.values()) == 3 and sum(opened.values()) == 1, (where, reach, opened)


def test_bot_imports_the_runtime_only_through_its_facade() -> None:
    """Every module of ``bot/`` (faces and what sits beside them) imports the runtime's
    names from ``approvald.runtime``, never from a layer inside it (issue 47): what the
    faces use of the runtime is the facade's table, in one place."""
    assert dict(ci_architecture().past_the_facade()) == {}


def test_the_count_sees_every_way_past_the_facade(tmp_path: Path) -> None:
    """The check above cannot pass by counting nothing: a deep import is counted at module
    level and in a function, under ``TYPE_CHECKING``, as ``import``, relative, and as a
    submodule (or a name the table does not export) taken from the facade itself; names
    the facade exports are not."""
    architecture = ci_architecture()
    bot = tmp_path / "bot"
    (bot / "web").mkdir(parents=True)
    (bot / "web" / "face.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from approvald.runtime import Engine, binding, tool\n"
        "from approvald.runtime.record.outbox_kinds import Mail\n"           # 1
        "import approvald.runtime.engine\n"                                   # 2
        "from ...runtime.kernel import clock\n"                               # 3
        "from approvald.runtime import kernel, not_exported\n"                # 4, 5
        "if TYPE_CHECKING:\n"
        "    from approvald.runtime.engine import Engine\n"                   # 6
        "def f():\n"
        "    from approvald.runtime.kernel.identity import normalize_user_id\n"  # 7
        "from approvald.store import Database\n"
        "from . import pages\n")
    architecture.BOT, root = bot, architecture.ROOT
    architecture.ROOT = tmp_path
    try:
        found = dict(architecture.past_the_facade())
    finally:
        architecture.BOT, architecture.ROOT = ROOT / "bot", root
    assert found == {"bot/web/face.py": 7}


def test_the_callers_module_lives_in_the_runtime() -> None:
    """What the MCP gateways and the coding assistants' hooks share is the runtime's (it
    knows no face), not a module of ``bot/`` beside the faces."""
    assert not (ROOT / "bot" / "callers.py").exists()
    assert (ROOT / "runtime" / "callers.py").exists()


# the test modules that still open a transaction of their own (issue 47, item 6): the rest
# read and forge rows through ``tests.helpers.Rows``; a new test does too, so this only
# goes down as modules move over (92 before the reads through ``parts(E).db`` moved too,
# 54 before the one-off reads and forged histories moved, 14 before the audit chain's
# tests, the PostgreSQL reset's and the model-based test's moved); those left test a
# transaction itself (claims, locks, snapshots, cancelling, reconnecting, round trips,
# closing, migrating, isolation, the fast path against SQLAlchemy, the write lock's order)
OWN_TRANSACTIONS = 11
# the places outside tests/helpers.py that still take the database from the engine's parts
# (``parts(E).db``): a part to spy on (opened_by_faces, crash_recording_after), a
# collaborator built from it (Switches, a token made with its own audit trail), the fast
# path's plans compared inside one transaction, and the benchmarks' own polling (kept as
# it is so their figures stay comparable); 180 before
PARTS_DB = 10


def test_tests_reach_the_database_through_the_one_helper() -> None:
    import re

    opens = re.compile(r"\.(read|write)\((snapshot=True)?\) as tx|\.connection\(\) as conn")
    own = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                 if p != Path(__file__).resolve() and opens.search(p.read_text()))
    assert len(own) <= OWN_TRANSACTIONS, (
        f"{len(own)} test modules open a transaction themselves (at most "
        f"{OWN_TRANSACTIONS}): read and forge rows through tests.helpers.Rows instead")
    assert "tests/unit/test_webhook_outbox.py" not in own
    through_parts = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "tests").rglob("*.py")
                     if p.name != "helpers.py" and p != Path(__file__).resolve()
                     for n, line in enumerate(p.read_text().splitlines(), 1)
                     if re.search(r"parts\(.*\)\.db\b", line)]
    assert len(through_parts) <= PARTS_DB, (
        f"read and forge rows through tests.helpers.Rows, not parts(engine).db: "
        f"{through_parts}")
