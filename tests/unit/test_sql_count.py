"""The benchmarks' statement counter: what it reports between two snapshots."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).parents[1] / "benchmarks" / "sql_count.py"
_SPEC = importlib.util.spec_from_file_location("sql_count", _PATH)
assert _SPEC and _SPEC.loader
sql_count = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sql_count)

READ = "SELECT approvals.id, approvals.run_id,\n  approvals.args FROM approvals WHERE x = $1"
LOCK = "SELECT runs.id FROM runs WHERE runs.id = $1 FOR NO KEY UPDATE"


def test_statements_sent_between_snapshots_most_sent_first_and_on_one_line() -> None:
    before = {"BEGIN;": 10, READ: 4, LOCK: 7, "COMMIT;": 10}
    after = {"BEGIN;": 13, READ: 10, LOCK: 7, "COMMIT;": 13,
             "UPDATE t SET a=1 RETURNING t.a, t.b, t.c": 1}
    assert sql_count.by_statement(before, after) == [
        (6, "SELECT * FROM approvals WHERE x = $1"),
        (3, "BEGIN;"), (3, "COMMIT;"),
        (1, "UPDATE t SET a=1 RETURNING *"),
    ]  # the lock, not sent in between, is left out
    assert sql_count.per_kind(before, after) == {
        "SELECT": 6, "BEGIN;": 3, "COMMIT;": 3, "UPDATE": 1, "all": 13}


def test_a_begin_is_counted_however_asyncpg_spells_it() -> None:
    kinds = sql_count.per_kind({}, {"BEGIN;": 2, "BEGIN ISOLATION LEVEL READ COMMITTED;": 3,
                                    "COMMIT;": 5})
    assert sql_count.begins(kinds) == 5


def test_a_short_or_computed_column_list_is_kept() -> None:
    assert sql_count.shape(LOCK) == LOCK
    two = "UPDATE h SET seq=h.seq WHERE h.id = $1 RETURNING h.seq, h.hash"
    assert sql_count.shape(two) == two
    notify = "SELECT pg_notify('approvald', p) FROM unnest($1::text[]) AS p"
    assert sql_count.shape(notify) == notify
    assert sql_count.shape("SELECT DISTINCT r.a, r.b, r.c FROM r") == "SELECT DISTINCT * FROM r"


def test_a_statement_is_told_by_the_store_method_that_sent_it_and_who_asked() -> None:
    # bench_replicas --breakdown: the outermost store frame (the repository's method,
    # not the driver call under it) and the first runtime frame above it
    root = Path(sql_count.__file__).resolve().parents[2]
    ns: dict[str, object] = {"origin": sql_count.origin}

    def define(path: str, src: str) -> None:
        exec(compile(src, str(root / path), "exec"), ns)

    define("store/fastsql.py", "def execute():\n    return origin(1)\n")
    define("store/repos/outbox.py", "def claim_heads():\n    return execute()\n")
    define("runtime/record/outbox.py", "def drain_once():\n    return claim_heads()\n")
    define("bot/serve.py", "def start():\n    return drain_once()\n")
    said = ns["start"]()  # type: ignore[operator]
    assert said == "store/repos/outbox.py:claim_heads < runtime/record/outbox.py:drain_once"
    assert ns["execute"]() == "store/fastsql.py:execute < ?"  # type: ignore[operator]
