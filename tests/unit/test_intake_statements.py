"""What an intake decision answered at once sends the database, statement by statement
(issue 50), and why each statement taken off that path was not needed.

An auto or forbidden answer is one write: the request's run and row, the hook's start
of the call where it runs the call at once, and the two audit entries chained (on
PostgreSQL one statement, sent alone in autocommit, which writes all of it or nothing;
a write transaction when it wrote nothing, and on SQLite). Its document is built from
what that write wrote (the tests below show it is the one a read gives), the outbox
is signalled only when something was queued, and a caller face that has just found its
call's key free does not look it up again (a request made meanwhile is still found by
the insert's conflict on the key).

The counts are exact: every statement the driver is given (sqlite3's trace callback;
asyncpg's calls, less the liveness ping of a connection that idled).
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from approvald.bot.claude_code import ClaudeCodeHook, HookEvent
from approvald.runtime.engine import Engine, assemble
from approvald.runtime.kernel.webhook_hosts import WebhookHosts
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs import external
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.external import WEBHOOK, NewRequest
from approvald.store.db import Database

from tests.helpers import Rows, create_token, parts, revoke_token

KEYS = api_tokens.WebhookKeys("approvald-test-secret-0123456789")
POLICY = PolicyFile.model_validate({"tools": {
    "api:*/read_metrics": {"policy": "auto"},
    "api:*/drop_table": {"policy": "forbidden"},
    "hook:claude-code/Bash": {"approvers": ["U_ALICE"], "rules": [
        {"when": 'args.command.startsWith("ls")', "policy": "auto"}]},
}})
_LITERAL = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


class Statements:
    """Every statement the test's database connections are given, by its text."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._lock = threading.Lock()
        self._ping = False

    def add(self, sql: str) -> None:
        sql = " ".join(sql.split())
        if sql.startswith("--"):  # a trigger's statement, part of the one that fired it
            return
        with self._lock:
            # store.liveness pings a connection that idled: BEGIN; ; ROLLBACK; (not counted)
            if sql == ";" and self.sent[-1:] == ["BEGIN;"]:
                self.sent.pop()
                self._ping = True
            elif self._ping and sql == "ROLLBACK;":
                self._ping = False
            else:
                self.sent.append(_LITERAL.sub("?", sql))

    def during(self) -> _Window:
        return _Window(self)


class _Window:
    def __init__(self, s: Statements) -> None:
        self.s = s
        self.start = len(s.sent)

    @property
    def sent(self) -> list[str]:
        return self.s.sent[self.start:]

    def kinds(self) -> collections.Counter[str]:
        """By the statement's first words: ``BEGIN``, ``COMMIT``, ``SELECT api_tokens``,
        ``INSERT runs``..."""
        out: collections.Counter[str] = collections.Counter()
        for sql in self.sent:
            words = sql.replace("INTO ", "").replace("FROM ", "").split()
            head = words[0].upper().rstrip(";")
            if head == "SELECT":
                table = re.search(r"\bFROM (\w+)", sql)
                head += " " + (table.group(1) if table else "?")
            elif head in ("INSERT", "UPDATE"):
                head += " " + words[1]
            out[head] += 1
        return out


@pytest.fixture
def statements(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Statements]:
    """Counts what the test's connections send (opened after this: the ``db`` fixture's
    connections open on first use)."""
    seen = Statements()
    if db_url.startswith("sqlite"):
        connect = sqlite3.connect

        def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = connect(*args, **kwargs)
            conn.set_trace_callback(seen.add)
            return conn

        monkeypatch.setattr(sqlite3, "connect", traced)
    else:
        import asyncpg.connection  # type: ignore[import-untyped]
        import asyncpg.prepared_stmt  # type: ignore[import-untyped]

        def counted(cls: Any, name: str, sql_of: Callable[[Any, tuple[Any, ...]], str]
                    ) -> None:
            original = getattr(cls, name)

            async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                seen.add(sql_of(self, args))
                return await original(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, call)

        for name in ("fetch", "fetchrow", "fetchval", "executemany"):
            counted(asyncpg.prepared_stmt.PreparedStatement, name,
                    lambda self, args: self._query)
        for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
            counted(asyncpg.connection.Connection, name, lambda self, args: args[0])
    yield seen


async def setup(make_engine: Callable[..., Engine], *, webhook: bool = False,
                name: str = "bot") -> tuple[Engine, Any]:
    engine = make_engine(policy=POLICY)
    made = await create_token(engine, KEYS, name,
                            created_by="test", via="test", tools="*",
                            webhook_url="https://hooks.example/approvald"
                            if webhook else None,
                            webhook_hosts=WebhookHosts.from_setting("hooks.example"))
    return engine, made.record


def request_lines(dialect: str) -> collections.Counter[str]:
    """The request and its run: on PostgreSQL one statement (``WITH run AS (INSERT INTO
    runs ...) INSERT INTO external_requests ... ON CONFLICT DO NOTHING``)."""
    if dialect == "postgresql":
        return collections.Counter({"WITH": 1})
    return collections.Counter({"INSERT runs": 1, "INSERT external_requests": 1})


def audit_lines(dialect: str) -> collections.Counter[str]:
    """Two entries chained to the head as this process last left it, not read first: the
    head moved if it is still that one, and the entries (on PostgreSQL one statement,
    ``WITH moved AS (UPDATE audit_head ... WHERE seq = ... AND hash = ...) INSERT INTO
    audit_log ... WHERE EXISTS (moved)``)."""
    if dialect == "postgresql":
        return collections.Counter({"WITH": 1})
    return collections.Counter({"UPDATE audit_head": 1, "INSERT audit_log": 2})


def answered_lines(dialect: str, *, started: bool = False) -> collections.Counter[str]:
    """A request answered at once: on PostgreSQL one statement records it, its run, its
    call's start (a hook's) and its two audit entries chained (``WITH run AS (INSERT INTO
    runs ...), req AS (INSERT INTO external_requests ... SELECT ... WHERE <its token is
    live> ON CONFLICT DO NOTHING RETURNING id), moved AS (UPDATE audit_head ...), entries
    AS (INSERT INTO audit_log ...) SELECT <requests inserted>, <entries inserted>``)."""
    if dialect == "postgresql":
        return collections.Counter({"WITH": 1})
    return request_lines(dialect) + audit_lines(dialect) \
        + collections.Counter({"INSERT tool_executions": 1} if started else {})


def written(dialect: str) -> collections.Counter[str]:
    """How a write that is one statement is sent: on PostgreSQL alone, in autocommit (no
    ``BEGIN``, no ``COMMIT``: one statement is atomic, all its CTEs or none); on SQLite
    in a write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``)."""
    if dialect == "postgresql":
        return collections.Counter()
    return collections.Counter({"BEGIN": 1, "COMMIT": 1})


async def test_an_api_auto_answer_is_one_write_transaction(make_engine, statements) -> None:
    engine, token = await setup(make_engine)
    await engine.open_request(token, NewRequest(  # connections opened, plans made
        tool="read_metrics", args={"n": 0}, requested_by="U_DANA"))
    window = statements.during()
    doc, new = await engine.open_request(token, NewRequest(
        tool="read_metrics", args={"n": 1}, requested_by="U_DANA"))
    assert new and doc["status"] == "approved"
    dialect = Rows.of(engine).dialect
    assert window.kinds() == written(dialect) + answered_lines(dialect), window.sent
    if dialect == "postgresql":
        assert len(window.sent) == 1


async def test_a_hook_auto_call_is_one_write_transaction(make_engine, statements) -> None:
    """A hook's auto call, from its event to its allow: its credential and its switch
    found before are kept (the write checks both, and the bearer token's life), a call
    this process has not seen is tried under its first generation's key without a look-up
    (made before, the insert's conflict finds it): one statement on PostgreSQL, sent
    alone in autocommit (``BEGIN`` and ``COMMIT`` before issue 50's round five)."""
    engine, _ = await setup(make_engine)
    bearer = await _made_hook_token(engine)

    def hook(i: int) -> ClaudeCodeHook:
        event = HookEvent.read(
            b'{"hook_event_name": "PreToolUse", "session_id": "s1", "cwd": "/srv", '
            b'"tool_name": "Bash", "tool_input": {"command": "ls /srv/%d"}, '
            b'"tool_use_id": "toolu_%d"}' % (i, i))
        return ClaudeCodeHook(engine, event, requested_by="U_DANA", bearer=bearer.name,
                              bearer_id=bearer.id)

    said = await hook(0).pre_tool_use(wait=0)  # the credential made, connections opened
    assert said["hookSpecificOutput"]["permissionDecision"] == "allow"
    window = statements.during()
    said = await hook(1).pre_tool_use(wait=0)
    assert said["hookSpecificOutput"]["permissionDecision"] == "allow", said
    dialect = Rows.of(engine).dialect
    assert window.kinds() == written(dialect) + answered_lines(dialect, started=True), \
        window.sent
    if dialect == "postgresql":
        assert len(window.sent) == 1


async def _made_hook_token(engine: Engine, name: str = "dana-hook") -> Any:
    made = await create_token(engine, KEYS, name,
                            created_by="test", via="test", face="hook:claude-code",
                            requested_by="U_DANA")
    return made.record


# -- why each statement taken off the path was not needed --------------------------------

@pytest.mark.parametrize("tool,webhook", [("read_metrics", False), ("read_metrics", True),
                                          ("drop_table", False), ("drop_table", True)])
async def test_an_answer_at_once_is_the_document_a_read_gives(
        make_engine, tool: str, webhook: bool) -> None:
    """The run, the request, its approvals and its execution were read back after the
    answer was committed; the document built from what was written is that one, and so
    is the one its webhook carries."""
    engine, token = await setup(make_engine, webhook=webhook)
    doc, new = await engine.open_request(token, NewRequest(
        tool=tool, args={"n": 1, "why": "ok"}, requested_by="U_DANA"))
    assert new and doc["status"] == ("approved" if tool == "read_metrics" else "forbidden")
    assert doc == await engine.request_document(token, doc["id"])
    hooks = await Rows.of(engine).outbox(WEBHOOK)
    assert [h.payload_value()["document"] for h in hooks] == ([doc] if webhook else [])


async def test_a_run_as_inserted_is_the_run_a_read_gives(db, clock) -> None:
    """The run's row was read back after its insert; the record the insert returns is
    the same, every column (those it does not name take their defaults)."""
    made = await Rows(db).in_one_write(
        lambda tx: tx.runs.create(run_id="x" + "1" * 31, agent="external:bot",
                                  task="a task", requested_by="U_DANA",
                                  instructions_version="http_api", now=clock.now(),
                                  status="external"))
    assert made == await Rows(db).run(made.id)


async def test_an_answer_at_once_signals_the_outbox_only_when_it_queued(make_engine) -> None:
    """Deliveries (and waiters) heard of every request made; an answer given at once
    that queued nothing has nothing to deliver and nobody waiting for it. One that
    queued its webhook is still heard of at once."""
    for webhook in (False, True):
        engine, token = await setup(make_engine, webhook=webhook, name=f"bot{int(webhook)}")
        heard: list[None] = []
        engine.on_outbox(lambda heard=heard: heard.append(None))
        await engine.open_request(token, NewRequest(
            tool="read_metrics", args={"webhook": webhook}, requested_by="U_DANA"))
        assert len(heard) == (1 if webhook else 0)
        await engine.open_request(token, NewRequest(  # a card to post: always
            tool="deploy", args={"webhook": webhook}, requested_by="U_DANA"))
        assert len(heard) == (2 if webhook else 1)


async def test_a_fresh_key_taken_meanwhile_is_still_found(make_engine) -> None:
    """A caller face that just found its key free creates without looking it up again:
    a request made under that key meanwhile is found by the insert's conflict, the same
    request again (nothing new written) and other contents refused as before."""
    engine, token = await setup(make_engine)
    req = NewRequest(tool="read_metrics", args={"n": 1}, requested_by="U_DANA",
                     idempotency_key="k1")
    first, new = await engine.open_request(token, req, fresh=True)
    assert new
    again, new = await engine.open_request(token, req, fresh=True)
    assert (again, new) == (await engine.request_document(token, first["id"]), False)
    with pytest.raises(external.ExternalError) as exc:
        await engine.open_request(token, NewRequest(
            tool="read_metrics", args={"n": 2}, requested_by="U_DANA",
            idempotency_key="k1"), fresh=True)
    assert exc.value.code == "idempotency_conflict"
    runs = [r for r in await Rows.of(engine).runs(limit=50)
            if r.agent == "external:bot"]
    assert len(runs) == 1  # the losing inserts' runs were rolled back with them


async def test_a_hook_call_started_with_its_request_is_taken_once_and_audited(
        make_engine) -> None:
    """The hook's auto call records its start in its request's transaction instead of a
    start of its own after it: one intent row, owned by the tool use; the same call made
    again is a request of its own, also started; the chain verifies."""
    engine, _ = await setup(make_engine)

    def hook(use: str) -> ClaudeCodeHook:
        event = HookEvent.read(
            b'{"hook_event_name": "PreToolUse", "session_id": "s1", "cwd": "/srv", '
            b'"tool_name": "Bash", "tool_input": {"command": "ls /srv"}, '
            b'"tool_use_id": "%s"}' % use.encode())
        return ClaudeCodeHook(engine, event, requested_by="U_DANA", bearer="dana")

    ids = []
    for use in ("toolu_1", "toolu_2"):
        h = hook(use)
        said = await h.pre_tool_use(wait=0)
        assert said["hookSpecificOutput"]["permissionDecision"] == "allow"
        rid = await Rows.of(engine).started_by(h.ledger_owner)
        assert rid is not None
        started = await Rows.of(engine).execution(rid, external.CALL_ID)
        assert started is not None and started.status == "started"
        ids.append(rid)
    assert ids[0] != ids[1]  # the same call again: a request of its own
    entries = [e for e in await Rows.of(engine).audit() if e.run_id in ids]
    assert sorted((e.run_id, e.action) for e in entries) == sorted(
        (rid, action) for rid in ids for action in ("requested", "approved"))
    assert (await Rows.of(engine).verify_audit()).ok


async def test_answers_at_once_from_two_processes_keep_the_chain_linear(
        make_engine, db_url: str, clock) -> None:
    """Each answer's two entries are chained in one statement on PostgreSQL (the rows and
    the head's move), after the head's lock: two processes answering at once (two
    connection pools on one database) still make one chain, every entry once, in order."""
    engine, token = await setup(make_engine)
    other_db = Database(db_url, server_time=False)
    try:
        other = assemble(other_db, Registry([], policy=POLICY), clock=clock)
        calls = [(e, i) for i in range(30) for e in (engine, other)]
        docs = await asyncio.gather(*(e.open_request(token, NewRequest(
            tool="read_metrics" if i % 3 else "drop_table", args={"i": i, "by": id(e)},
            requested_by="U_DANA")) for e, i in calls))
        assert all(new for _, new in docs)
        report = await Rows.of(engine).verify_audit()
        assert report.ok, report.problems
        entries = await Rows.of(engine).audit()
        assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
        ids = {doc["id"] for doc, _ in docs}
        mine = collections.Counter(e.run_id for e in entries if e.run_id in ids)
        assert len(mine) == len(calls) and set(mine.values()) == {2}
    finally:
        await other_db.close()


def _first_words(sent: list[str]) -> list[str]:
    return [q.split()[0].rstrip(";") for q in sent]


@pytest.mark.parametrize("tool", ["read_metrics", "drop_table"])
async def test_a_stale_head_guess_writes_nothing_and_the_answer_is_chained_under_the_lock(
        make_engine, db_url: str, clock, statements, tool: str) -> None:
    """On PostgreSQL an answer at once is one statement sent alone (autocommit): its run,
    its request and its two entries, chained to the head this process last left. Another
    process moved the head since: that statement writes nothing at all (it fails whole:
    committed, its request would stand without its entries), and the answer is written by
    the transaction that reads the head under its lock, as before (the request inserted
    once, under its id); the next answer is alone again. SQLite: one write transaction
    each time (the head's compare-and-set, then the head read)."""
    engine, token = await setup(make_engine)
    other_db = Database(db_url, server_time=False)
    try:
        other = assemble(other_db, Registry([], policy=POLICY), clock=clock)
        await engine.open_request(token, NewRequest(  # this process's guess of the head
            tool=tool, args={"n": 0}, requested_by="U_DANA"))
        await other.open_request(token, NewRequest(  # the head moved elsewhere
            tool=tool, args={"n": 1}, requested_by="U_DANA"))
        window = statements.during()
        doc, new = await engine.open_request(token, NewRequest(
            tool=tool, args={"n": 2}, requested_by="U_DANA"))
        stale = window.sent
        window = statements.during()
        after, _ = await engine.open_request(token, NewRequest(
            tool=tool, args={"n": 3}, requested_by="U_DANA"))
        alone = window.sent
    finally:
        await other_db.close()
    assert new and doc == await engine.request_document(token, doc["id"])
    answer = "approved" if tool == "read_metrics" else "denied"
    for d in (doc, after):
        actions = [e.action for e in await Rows.of(engine).audit() if e.run_id == d["id"]]
        assert actions == ["requested", answer], actions
    entries = await Rows.of(engine).audit()
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    report = await Rows.of(engine).verify_audit()
    assert report.ok, report.problems
    runs = [r for r in await Rows.of(engine).runs(limit=50) if r.agent == "external:bot"]
    assert len(runs) == 4  # no run without its request, none twice
    if Rows.of(engine).dialect == "postgresql":
        # the alone statement (failed whole), then the transaction: the request and its
        # run, the head locked and read, the entries chained
        assert _first_words(stale) == ["WITH", "BEGIN", "WITH", "UPDATE", "WITH",
                                       "COMMIT"], stale
        assert _first_words(alone) == ["WITH"], alone


@pytest.mark.parametrize("what", ["answer", "report"])
async def test_a_head_moved_while_the_statement_waits_for_it_writes_nothing_of_it(
        make_engine, db_url: str, clock, what: str) -> None:
    """The head this process guessed is still the committed one when its statement
    begins (its snapshot), but another process's transaction holds it, moved and not yet
    committed: the statement's rows are written (a request and its run, or a kept call's
    report), then it waits for the head, finds it moved and chains nothing. Alone, in
    autocommit, nothing may stay of it: it fails whole, and the answer (the report) is
    written again by a transaction that reads the head under its lock. Committed, the
    request would stand without its entries (the transaction after it then finds its id
    taken: "revoked meanwhile"), the report without its ``executed`` entry (then taken as
    a report made before: not new)."""
    from approvald.runtime.runs.external import Report
    engine, token = await setup(make_engine)
    other_db = Database(db_url, server_time=False)
    try:
        other = assemble(other_db, Registry([], policy=POLICY), clock=clock)
        made, _ = await engine.open_request(token, NewRequest(  # this process's guess
            tool="read_metrics", args={"n": 0}, requested_by="U_DANA", start_owner="gw"))
        trail = parts(other).audit
        chain, chained, go = trail._chain, asyncio.Event(), asyncio.Event()

        async def held(tx: Any) -> None:  # the other's chaining, held before its COMMIT
            await chain(tx)
            chained.set()
            await go.wait()

        trail._chain = held
        elsewhere = asyncio.ensure_future(other.open_request(token, NewRequest(
            tool="read_metrics", args={"n": 1}, requested_by="U_DANA")))
        await chained.wait()
        if what == "answer":
            mine = asyncio.ensure_future(engine.open_request(token, NewRequest(
                tool="read_metrics", args={"n": 2}, requested_by="U_DANA")))
        else:
            mine = asyncio.ensure_future(engine.record_request_report(
                token, made["id"], Report("succeeded", made["effective_digest"], {"n": 0},
                                          None)))
        if Rows.of(engine).dialect == "postgresql":
            for _ in range(500):  # until it waits for the head's lock, its rows written
                if await Rows.of(engine).select(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE 'WITH guessed%'"):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the statement never waited for the head")
        else:
            await asyncio.sleep(0.2)  # (SQLite: it waits for the database's write lock)
        go.set()
        await elsewhere
        done = await mine
        trail._chain = chain
    finally:
        await other_db.close()
    rid = done[0]["id"] if what == "answer" else made["id"]
    if what == "report":
        assert done is True
        after = await engine.request_document(token, rid)
        assert after["result"]["status"] == "succeeded", after
    actions = [e.action for e in await Rows.of(engine).audit() if e.run_id == rid]
    assert actions == (["requested", "approved"] if what == "answer"
                       else ["requested", "approved", "executed"]), actions
    entries = await Rows.of(engine).audit()
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    report = await Rows.of(engine).verify_audit()
    assert report.ok, report.problems
    runs = [r for r in await Rows.of(engine).runs(limit=50) if r.agent == "external:bot"]
    assert len(runs) == (3 if what == "answer" else 2)


async def test_answers_and_kept_reports_from_two_processes_at_once_are_written_whole(
        make_engine, db_url: str, clock) -> None:
    """Two processes (two connection pools on one database) making auto calls that they
    run and report themselves, all at once: each write (the request with its start and
    entries; the kept report with its entry) is one statement alone on PostgreSQL, and
    the other process's chainings make most head guesses stale. Every request has its
    run, its start, its result and its three entries, once; no run, request or result
    stands without its entries (a guess found stale wrote nothing and was written again
    under the head's lock); one chain, in order."""
    from approvald.runtime.runs.external import CALL_ID, Report
    engine, token = await setup(make_engine)
    other_db = Database(db_url, server_time=False)
    try:
        other = assemble(other_db, Registry([], policy=POLICY), clock=clock)

        async def call(e: Engine, i: int) -> str:
            doc, new = await e.open_request(token, NewRequest(
                tool="read_metrics", args={"i": i, "by": id(e)}, requested_by="U_DANA",
                start_owner=f"gw{id(e)}"))
            assert new and doc["status"] == "approved"
            assert await e.record_request_report(token, doc["id"], Report(
                "succeeded", doc["effective_digest"], {"i": i}, None))
            return str(doc["id"])

        ids = await asyncio.gather(*(call(e, i) for i in range(15) for e in (engine, other)))
    finally:
        await other_db.close()
    assert len(set(ids)) == 30
    entries = await Rows.of(engine).audit()
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    report = await Rows.of(engine).verify_audit()
    assert report.ok, report.problems
    by_run: dict[str, list[str]] = collections.defaultdict(list)
    for e in entries:
        by_run[str(e.run_id)].append(e.action)
    for rid in ids:
        assert by_run[rid] == ["requested", "approved", "executed"], (rid, by_run[rid])
        run = await Rows.of(engine).run(rid)
        assert run.status == "completed" and json.loads(run.result)["i"] in range(15)
        ran = await Rows.of(engine).execution(rid, CALL_ID)
        assert ran is not None and ran.status == "succeeded", ran
    runs = [r for r in await Rows.of(engine).runs(limit=100) if r.agent == "external:bot"]
    assert len(runs) == 30


# -- a caller face that runs the call itself: its start and its report ------------------

async def test_the_start_and_report_of_an_auto_call_read_each_row_once(
        make_engine, statements) -> None:
    """An auto call whose caller starts and reports it itself (the HTTP API's
    ``/start`` and ``/report``; the MCP gateway's now has its start recorded with its
    request, and its report kept: see below): its start and its report, each one write
    transaction that reads the run (under its lock) and the request once. The run is not locked and
    read again to see whether the request's window closed, and an auto request's
    approvals (it has none: nothing was asked) are not read; the report's document is
    not read back (the gateway tells its client what it ran)."""
    from approvald.runtime.runs.external import CALL_ID, Report
    engine, token = await setup(make_engine)
    for i in range(2):  # the first: connections opened, plans made
        doc, new = await engine.open_request(token, NewRequest(
            tool="read_metrics", args={"n": i}, requested_by="U_DANA"))
        assert new and doc["status"] == "approved"
        window = statements.during()
        await engine.start_request(token, doc["id"], args_digest=doc["effective_digest"],
                                    owner="gw")
        started = window.kinds()
        window = statements.during()
        assert await engine.record_request_report(token, doc["id"], Report(
            "succeeded", doc["effective_digest"], {"rows": i}, None))
        reported = window.kinds()
    # run locked and read, request locked, the intent
    lock = {"SELECT runs": 1, "SELECT external_requests": 1}
    assert started == collections.Counter({"BEGIN": 1, **lock, "INSERT tool_executions": 1,
                                           "COMMIT": 1}), started
    assert reported == collections.Counter({
        "BEGIN": 1, **lock, "SELECT tool_executions": 1, "UPDATE tool_executions": 1,
        "UPDATE external_requests": 1, "UPDATE runs": 1, "COMMIT": 1,
        **_one_entry(Rows.of(engine).dialect)}), reported
    after = await engine.request_document(token, doc["id"])
    assert after["status"] == "approved" and after["result"]["status"] == "succeeded"
    ran = await Rows.of(engine).execution(doc["id"], CALL_ID)
    assert ran is not None and ran.status == "succeeded" and ran.owner == "gw"
    assert (await Rows.of(engine).verify_audit()).ok


def _one_entry(dialect: str) -> dict[str, int]:
    if dialect == "postgresql":
        return {"WITH": 1}
    return {"UPDATE audit_head": 1, "INSERT audit_log": 1}


async def test_an_auto_call_started_or_reported_twice_is_refused_as_before(
        make_engine) -> None:
    """Without its approvals read, an auto request's start and report still refuse what
    they refused: a second start (already started), a report with other arguments, a
    second report with another result; the same report again is not new."""
    from approvald.runtime.runs.external import ExternalError, Report
    engine, token = await setup(make_engine)
    doc, _ = await engine.open_request(token, NewRequest(
        tool="read_metrics", args={"n": 1}, requested_by="U_DANA"))
    await engine.start_request(token, doc["id"], args_digest=doc["effective_digest"],
                                owner="gw")
    with pytest.raises(ExternalError) as exc:
        await engine.start_request(token, doc["id"], args_digest=doc["effective_digest"],
                                    owner="gw2")
    assert exc.value.code == "already_started"
    with pytest.raises(ExternalError) as exc:
        await engine.record_request_report(token, doc["id"], Report(
            "succeeded", "0" * 64, {"rows": 1}, None))
    assert exc.value.code == "digest_mismatch"
    rep = Report("succeeded", doc["effective_digest"], {"rows": 1}, None)
    assert await engine.record_request_report(token, doc["id"], rep)
    assert not await engine.record_request_report(token, doc["id"], rep)
    with pytest.raises(ExternalError) as exc:
        await engine.record_request_report(token, doc["id"], Report(
            "succeeded", doc["effective_digest"], {"rows": 2}, None))
    assert exc.value.code == "already_reported"
    forbidden, _ = await engine.open_request(token, NewRequest(
        tool="drop_table", args={"n": 1}, requested_by="U_DANA"))
    with pytest.raises(ExternalError) as exc:
        await engine.start_request(token, forbidden["id"],
                                    args_digest=forbidden["effective_digest"], owner="gw")
    assert exc.value.code == "not_approved"


# -- the caller's token from memory, its liveness checked by the write ------------------

async def _made_token(engine: Engine, name: str = "bot") -> api_tokens.NewToken:
    return await create_token(engine, KEYS, name,
                            created_by="test", via="test", tools="*")


async def test_an_api_auto_decision_is_one_statement_with_its_token_kept(
        make_engine, statements) -> None:
    """``POST /v1/requests``'s whole work for an auto answer, its token's check included:
    the token found once is kept in memory (its liveness is checked by the write), so the
    answer is the one statement on PostgreSQL, sent alone in autocommit (three before
    round five: ``BEGIN``, it, ``COMMIT``)."""
    engine = make_engine(policy=POLICY)
    made = await _made_token(engine)
    header = f"Bearer {made.token}"
    for i in range(2):  # the first: the token read, connections opened, plans made
        window = statements.during()
        token = await engine.caller(header, to_open=True)
        assert token is not None
        doc, new = await engine.open_request(token, NewRequest(
            tool="read_metrics", args={"n": i}, requested_by="U_DANA"))
        assert new and doc["status"] == "approved"
    dialect = Rows.of(engine).dialect
    assert window.kinds() == written(dialect) + answered_lines(dialect), window.sent
    if dialect == "postgresql":
        assert len(window.sent) == 1


@pytest.mark.parametrize("tool", ["read_metrics", "drop_table", "deploy"])
async def test_a_token_revoked_after_it_was_kept_makes_and_finds_nothing(
        make_engine, tool: str) -> None:
    """The token as read before its revocation (what memory keeps) makes no request, of
    any kind, and finds none under its idempotency key: a 401 (``unauthorized``), nothing
    written; the next look-up reads it again and finds it revoked."""
    engine = make_engine(policy=POLICY)
    made = await _made_token(engine)
    header = f"Bearer {made.token}"
    kept = await engine.caller(header, to_open=True)
    assert kept is not None
    await engine.open_request(kept, NewRequest(
        tool=tool, args={"n": 0}, requested_by="U_DANA", idempotency_key="k0"))
    await revoke_token(engine, "bot", by="test",
                       via="test")
    assert await engine.caller(header, to_open=True) == kept  # kept: not read again
    before = len(await Rows.of(engine).runs(limit=100))
    for key in ("k0", "k1", None):  # the key of a request it made, a new key, none
        with pytest.raises(external.ExternalError) as exc:
            await engine.open_request(kept, NewRequest(
                tool=tool, args={"n": 0}, requested_by="U_DANA", idempotency_key=key))
        assert exc.value.code == "unauthorized"
    assert len(await Rows.of(engine).runs(limit=100)) == before
    assert await engine.caller(header, to_open=True) is None  # forgotten, read again
    assert (await Rows.of(engine).verify_audit()).ok


async def test_a_forbidden_request_is_inserted_over(make_engine) -> None:
    """A forbidden request's run is inserted completed, with its result (no UPDATE after
    its INSERT): the row a read gives is the run the UPDATE left."""
    engine, token = await setup(make_engine)
    doc, _ = await engine.open_request(token, NewRequest(
        tool="drop_table", args={"n": 1}, requested_by="U_DANA"))
    run = await Rows.of(engine).run(doc["id"])
    assert run is not None and run.status == "completed"
    assert run.updated_at == run.created_at
    assert run.result is not None and json.loads(run.result) == {
        "status": "forbidden", "reason": doc["decision"]["reason"]}


# -- the hook's credential, switch, bearer token and first look-up, taken off its path --

def _bash(engine: Engine, bearer: Any, command: str, use: str) -> ClaudeCodeHook:
    event = HookEvent.read(json.dumps({
        "hook_event_name": "PreToolUse", "session_id": "s1", "cwd": "/srv",
        "tool_name": "Bash", "tool_input": {"command": command},
        "tool_use_id": use}).encode())
    return ClaudeCodeHook(engine, event, requested_by="U_DANA", bearer=bearer.name,
                          bearer_id=bearer.id)


async def _hook_runs(engine: Engine) -> int:
    return len([r for r in await Rows.of(engine).runs(limit=500)
                if r.agent.startswith("external:hook")])


async def test_a_hook_switched_off_after_it_was_kept_on_allows_nothing(make_engine) -> None:
    """The switch found on is kept, the write checks it: switched off elsewhere (another
    process: not through this engine), the next call is denied, saying who switched it
    off, and nothing is asked; switched on again, calls are allowed again."""
    from approvald.runtime.record import switches
    engine, _ = await setup(make_engine)
    bearer = await _made_hook_token(engine)
    said = await _bash(engine, bearer, "ls /a", "toolu_1").pre_tool_use(wait=0)
    assert said["hookSpecificOutput"]["permissionDecision"] == "allow"
    elsewhere = switches.Switches(parts(engine).db, parts(engine).clock, parts(engine).audit)
    await elsewhere.disable(switches.HOOK, ["http"], by="U_OPS", via="cli", reason="drill")
    runs = await _hook_runs(engine)
    said = await _bash(engine, bearer, "ls /b", "toolu_2").pre_tool_use(wait=0)
    out = said["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny" and "switched off by U_OPS" in \
        out["permissionDecisionReason"], out
    assert await _hook_runs(engine) == runs
    await elsewhere.enable(switches.HOOK, ["http"], by="U_OPS", via="cli")
    said = await _bash(engine, bearer, "ls /c", "toolu_3").pre_tool_use(wait=0)
    assert said["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert (await Rows.of(engine).verify_audit()).ok


async def test_a_hook_credential_revoked_after_it_was_kept_allows_nothing(
        make_engine) -> None:
    """The hook's own credential found live is kept, the write checks it: revoked
    elsewhere (the way the hook was switched off before switches existed), the next call
    is denied as switched off, nothing asked."""
    engine, _ = await setup(make_engine)
    bearer = await _made_hook_token(engine)
    said = await _bash(engine, bearer, "ls /a", "toolu_1").pre_tool_use(wait=0)
    assert said["hookSpecificOutput"]["permissionDecision"] == "allow"
    # as an older version's `tokens revoke` did
    assert await Rows.of(engine).revoke_token("hook.claude-code", by="U_OPS",
                                              now=engine.now()) is not None
    runs = await _hook_runs(engine)
    said = await _bash(engine, bearer, "ls /b", "toolu_2").pre_tool_use(wait=0)
    out = said["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny" and "switched off" in \
        out["permissionDecisionReason"], out
    assert await _hook_runs(engine) == runs


async def test_a_bearer_revoked_after_it_was_kept_is_refused(make_engine) -> None:
    """The person's HTTP hook token found live is kept (``POST /v1/hooks/claude-code``),
    the write checks it: revoked, its next call asks nothing and is refused as
    ``unauthorized`` (over HTTP: a 401, the token forgotten)."""
    engine, _ = await setup(make_engine)
    bearer = await _made_hook_token(engine)
    said = await _bash(engine, bearer, "ls /a", "toolu_1").pre_tool_use(wait=0)
    assert said["hookSpecificOutput"]["permissionDecision"] == "allow"
    await revoke_token(engine, bearer.name, by="test",
                       via="test")
    runs = await _hook_runs(engine)
    for command in ("ls /a", "ls /b"):  # a call made before, and a new one
        with pytest.raises(external.ExternalError) as exc:
            await _bash(engine, bearer, command, "toolu_2").pre_tool_use(wait=0)
        assert exc.value.code == "unauthorized"
    assert await _hook_runs(engine) == runs


async def test_a_call_made_by_another_process_is_found_without_the_first_look_up(
        make_engine) -> None:
    """A call this process has not seen is tried under its first generation's key at
    once. Made before by another process (here: this one's memory of its calls
    forgotten), the insert's conflict finds it: a call still waiting joins its request
    (one card, not two); one allowed and over makes the next generation's request."""
    engine, _ = await setup(make_engine)
    bearer = await _made_hook_token(engine)
    asked = await _bash(engine, bearer, "rm -rf /tmp/x", "toolu_1").pre_tool_use(wait=0)
    assert asked["hookSpecificOutput"]["permissionDecision"] == "deny"
    allowed = await _bash(engine, bearer, "ls /a", "toolu_2").pre_tool_use(wait=0)
    assert allowed["hookSpecificOutput"]["permissionDecision"] == "allow"
    engine.forget_calls()  # another process: no memory of these calls
    runs = await _hook_runs(engine)
    again = await _bash(engine, bearer, "rm -rf /tmp/x", "toolu_3").pre_tool_use(wait=0)
    reason = again["hookSpecificOutput"]["permissionDecisionReason"]
    assert again["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert await _hook_runs(engine) == runs  # joined: no second request
    first = asked["hookSpecificOutput"]["permissionDecisionReason"]
    rid = first.split("request ")[1].split(")")[0].split(" ")[0].rstrip(".,")
    assert rid in reason, (first, reason)
    engine.forget_calls()
    for use in ("toolu_4", "toolu_5"):
        said = await _bash(engine, bearer, "ls /a", use).pre_tool_use(wait=0)
        assert said["hookSpecificOutput"]["permissionDecision"] == "allow"
        engine.forget_calls()
    assert await _hook_runs(engine) == runs + 2  # each a request of its own
    assert (await Rows.of(engine).verify_audit()).ok


# -- the MCP gateway's auto call: forwarded, its result recorded --------------------------

MCP_POLICY = PolicyFile.model_validate({"tools": {"mcp:t/echo": {"policy": "auto"}}})


async def _echo(args: dict[str, Any]) -> Any:
    from approvald.bot.mcp.gateway import Ran
    return Ran(f"echo {args}", "succeeded", {"echo": args})


def _mcp_gateway(engine: Engine) -> Any:
    from approvald.bot.mcp.gateway import Gateway
    return Gateway(engine, name="t", requested_by="U_DANA", server="fake")


async def _mcp_run_ids(engine: Engine) -> set[str]:
    return {r.id for r in await Rows.of(engine).runs(limit=500)
            if r.agent.startswith("external:mcp")}


async def _new_mcp_run(engine: Engine, known: set[str]) -> str:
    """The one MCP gateway request made since ``known`` were."""
    [made] = await _mcp_run_ids(engine) - known
    return made


async def _mcp_runs(engine: Engine) -> int:
    return len([r for r in await Rows.of(engine).runs(limit=500)
                if r.agent.startswith("external:mcp")])


def reported_lines(dialect: str) -> collections.Counter[str]:
    """A kept call's report: on PostgreSQL one statement ends the run, records the report
    and the result and chains the ``executed`` entry (``WITH run AS (UPDATE runs ...), req
    AS (UPDATE external_requests ... WHERE ... result_digest IS NULL), ex AS (UPDATE
    tool_executions ... WHERE status = 'started' AND owner = ...), moved AS (UPDATE
    audit_head ...), entries AS (INSERT INTO audit_log ...) SELECT ...``)."""
    if dialect == "postgresql":
        return collections.Counter({"WITH": 1})
    return collections.Counter({"UPDATE runs": 1, "UPDATE external_requests": 1,
                                "UPDATE tool_executions": 1}) \
        + collections.Counter(_one_entry(dialect))


async def test_an_mcp_auto_call_is_two_write_transactions(make_engine, statements) -> None:
    from approvald.bot.mcp.gateway import Ran
    """An MCP gateway's auto call, from its call to its result recorded: its start is
    recorded with its request (one write: on PostgreSQL one statement, sent alone in
    autocommit), the call forwarded, and its report and ``executed`` entry written from
    what the request's write left in memory (one write: one statement alone). The
    gateway's credential found live once is kept (the request's statement checks it).
    17 statements before round four: the start a transaction of its own (BEGIN, run and
    request locked, the intent, COMMIT), the report nine (run and request locked, the
    intent read, three UPDATEs, the entry); 6 before round five (each write BEGIN, WITH,
    COMMIT)."""
    engine = make_engine(policy=MCP_POLICY)
    g = _mcp_gateway(engine)
    for i in range(2):  # the first: the credential made, connections opened, plans made
        known = await _mcp_run_ids(engine)
        window = statements.during()
        out = await g.call("echo", {"n": i}, _echo)
        assert isinstance(out, Ran) and out.status == "succeeded", out
    dialect = Rows.of(engine).dialect
    kinds = window.kinds()
    assert kinds["SELECT api_tokens"] == 0, window.sent
    assert kinds == written(dialect) + written(dialect) \
        + answered_lines(dialect, started=True) + reported_lines(dialect), window.sent
    if dialect == "postgresql":
        assert len(window.sent) == 2
        assert [q.split()[0].rstrip(";") for q in window.sent] == ["WITH", "WITH"]
    rid = await _new_mcp_run(engine, known)
    doc = await engine.request_document(await g.token(), rid)
    assert doc["status"] == "approved" and doc["result"]["status"] == "succeeded", doc
    assert doc["result"]["result"] == {"echo": {"n": 1}}
    run = await Rows.of(engine).run(rid)
    assert run is not None and run.status == "completed"
    assert json.loads(run.result or "null") == {"echo": {"n": 1}}
    entries = [e.action for e in await Rows.of(engine).audit() if e.run_id == rid]
    assert entries == ["requested", "approved", "executed"]
    assert (await Rows.of(engine).verify_audit()).ok


async def test_an_mcp_gateway_revoked_after_it_was_kept_executes_nothing(
        make_engine) -> None:
    """The gateway's credential found live is kept, the request's statement checks it:
    revoked elsewhere (another process's ``approvald tokens revoke mcp.t``), the next
    call, new or made before, is refused as switched off, nothing asked, nothing run."""
    from approvald.bot.mcp.gateway import Ran, Refused
    engine = make_engine(policy=MCP_POLICY)
    g = _mcp_gateway(engine)
    ran: list[dict[str, Any]] = []

    async def server(args: dict[str, Any]) -> Any:
        ran.append(args)
        return await _echo(args)

    assert isinstance(await g.call("echo", {"n": 0}, server), Ran)
    # not through this engine: nothing forgotten
    assert await Rows.of(engine).revoke_token("mcp.t", by="U_OPS", now=engine.now()) is not None
    runs = await _mcp_runs(engine)
    for n in (0, 1):  # a call made before, and a new one
        out = await g.call("echo", {"n": n}, server)
        assert isinstance(out, Refused) and out.status == "off", out
        assert "switched off" in out.message and "U_OPS" in out.message, out.message
    assert ran == [{"n": 0}]
    assert await _mcp_runs(engine) == runs
    assert (await Rows.of(engine).verify_audit()).ok


@pytest.mark.parametrize("how", ["cancelled", "ran"])
async def test_an_mcp_auto_call_closed_before_its_start_is_not_run(
        make_engine, how: str) -> None:
    """Without the run's status read before the start, a call answered at once whose
    request was closed meanwhile (cancelled by a person, or run and reported by another
    process of the gateway) is refused by the start and answered as before: not run.
    (A request made without its start, as earlier versions made them: one made now has
    its start recorded with it, so nothing can close it before its start.)"""
    from dataclasses import replace

    from approvald.bot.mcp.gateway import Ran, Refused
    from approvald.runtime.runs.external import Report
    engine = make_engine(policy=MCP_POLICY)
    g = _mcp_gateway(engine)
    new_request = g._new_request
    g._new_request = lambda *a: replace(new_request(*a), start_owner=None)
    ran: list[dict[str, Any]] = []
    made: list[str] = []

    async def server(args: dict[str, Any]) -> Any:
        ran.append(args)
        return await _echo(args)

    request = g._request

    async def closed_meanwhile(token: Any, tool: str, args: dict[str, Any],
                               **worked_out: Any) -> Any:
        doc, started = await request(token, tool, args, **worked_out)
        made.append(str(doc["id"]))
        if how == "cancelled":
            from approvald.runtime.approvals.decide import Actor
            assert await engine.cancel(doc["id"], actor=Actor("U_OPS", "cli:ops"),
                                       reason="drill") == "cancelled"
        else:  # another process started and reported it
            await engine.start_request(token, doc["id"], args_digest=doc["effective_digest"],
                                       owner="elsewhere")
            assert await engine.record_request_report(token, doc["id"], Report(
                "succeeded", doc["effective_digest"], {"echo": args}, None))
        return doc, started

    g._request = closed_meanwhile
    out = await g.call("echo", {"n": 1}, server)
    assert isinstance(out, Refused), out
    assert out.status == ("cancelled" if how == "cancelled" else "ran"), out
    assert out.request_id == made[0]
    said = "Nothing was executed" if how == "cancelled" else "It was not run again"
    assert said in out.message, out.message
    assert ran == []
    g._request = request
    assert isinstance(await g.call("echo", {"n": 2}, server), Ran)
    assert (await Rows.of(engine).verify_audit()).ok


async def test_an_mcp_bearer_revoked_after_it_was_kept_executes_nothing(make_engine) -> None:
    """Over HTTP, the bearer token a gateway's calls are made for, found live once, is
    kept (serve's ``/mcp/NAME`` for ``tools/call``); each request's statements check it:
    revoked, the next call, new or made before, is refused (``unauthorized``), nothing
    asked or run, and the token is forgotten (the next message reads it: a 401)."""
    from approvald.bot.mcp.gateway import Gateway, Ran, Refused
    engine = make_engine(policy=MCP_POLICY)
    made = await create_token(engine, KEYS, "dana-mcp", created_by="test", via="test",
                              face="mcp:t", requested_by="U_DANA")
    header = f"Bearer {made.token}"
    kept = await engine.caller(header, to_open=True)
    assert kept is not None
    g = Gateway(engine, name="t", requested_by="U_DANA", server="fake", bearer=kept.name,
                bearer_token=kept)
    ran: list[dict[str, Any]] = []

    async def server(args: dict[str, Any]) -> Any:
        ran.append(args)
        return await _echo(args)

    assert isinstance(await g.call("echo", {"n": 0}, server), Ran)
    await revoke_token(engine, "dana-mcp", by="test", via="test")
    assert await engine.caller(header, to_open=True) == kept  # kept: not read again
    runs = await _mcp_runs(engine)
    for n in (0, 1):  # a call made before, and a new one
        out = await g.call("echo", {"n": n}, server)
        assert isinstance(out, Refused) and out.status == "unauthorized", out
    assert ran == [{"n": 0}]
    assert await _mcp_runs(engine) == runs
    assert await engine.caller(header, to_open=True) is None  # forgotten, read again
    assert (await Rows.of(engine).verify_audit()).ok


async def test_an_mcp_auto_call_is_started_before_it_is_forwarded_and_never_run_again(
        make_engine) -> None:
    """The start's own transaction (run and request locked, the intent inserted) is gone:
    the intent row is committed by the request's write, before the call is forwarded
    (``started``, owned by this gateway's lease). A process killed mid-call (here: the
    forward broke off, its outcome unknown, and a new gateway object, with nothing in
    memory, makes the same call) leaves it started: it is never run again, and another
    process's start of it is refused (``already_started``)."""
    from approvald.bot.mcp.gateway import Refused
    from approvald.runtime.runs.external import CALL_ID, ExternalError
    engine = make_engine(policy=MCP_POLICY)
    first = _mcp_gateway(engine)
    seen: list[Any] = []

    async def dies(args: dict[str, Any]) -> Any:
        rid = await _new_mcp_run(engine, set())
        seen.append(await Rows.of(engine).execution(rid, CALL_ID))
        raise ConnectionError("the process died mid-call")

    with pytest.raises(ConnectionError):
        await first.call("echo", {"n": 1}, dies)
    [intent] = seen
    assert intent is not None and intent.status == "started", intent
    assert intent.owner.startswith(engine.process + "/"), intent.owner
    again, ran = _mcp_gateway(engine), []

    async def server(args: dict[str, Any]) -> Any:
        ran.append(args)
        return await _echo(args)

    out = await again.call("echo", {"n": 1}, server)
    assert isinstance(out, Refused) and out.status == "unknown", out
    assert "never runs such a call again" in out.message and intent.run_id in out.message
    assert ran == []
    token = await again.token()
    doc = await engine.request_document(token, intent.run_id)
    with pytest.raises(ExternalError) as exc:
        await engine.start_request(token, intent.run_id, args_digest=doc["effective_digest"],
                                   owner="elsewhere")
    assert exc.value.code == "already_started"
    after = await Rows.of(engine).execution(intent.run_id, CALL_ID)
    assert after.status == "started" and after.owner == intent.owner  # outcome unknown
    assert (await Rows.of(engine).verify_audit()).ok


async def test_the_same_mcp_auto_call_made_meanwhile_joins_the_one_started(
        make_engine) -> None:
    """The same call made again while the first, started with its request, is not yet
    running here (its request's write committed, its task not yet registered) waits for
    it, then joins it: the call is forwarded once and both get its result. Without that
    wait the second finds the request started, by no task of this process, and is refused
    as "outcome unknown" (``already_started``)."""
    from approvald.bot.mcp.gateway import Ran
    engine = make_engine(policy=MCP_POLICY)
    g = _mcp_gateway(engine)
    assert isinstance(await g.call("echo", {"warm": 1}, _echo), Ran)  # credential kept
    opened, requested = engine.open_request, g._request
    asked: list[Any] = []
    second: list[asyncio.Future[Any]] = []
    found = asyncio.Event()  # the second call has found its request

    async def open_request(token: Any, req: Any, **kw: Any) -> Any:
        asked.append(req)
        if len(asked) > 1:
            return await opened(token, req, **kw)
        doc, new = await opened(token, req, **kw)
        # the first call's request and start are committed: the second goes as far as
        # it can before the first takes its call (all it does is in memory until then)
        for _ in range(200):
            if len(asked) > 1:
                await asyncio.wait(second)
                break
            await asyncio.sleep(0)
        return doc, new

    async def request(token: Any, tool: str, args: dict[str, Any], **worked_out: Any) -> Any:
        out = await requested(token, tool, args, **worked_out)
        if len(asked) > 1:
            found.set()
        return out

    engine.open_request = open_request  # type: ignore[method-assign]
    g._request = request
    ran: list[dict[str, Any]] = []

    async def server(args: dict[str, Any]) -> Any:
        ran.append(args)
        await found.wait()  # still running when the second call looks
        return await _echo(args)

    first = asyncio.ensure_future(g.call("echo", {"n": 1}, server))
    second.append(asyncio.ensure_future(g.call("echo", {"n": 1}, server)))
    out_a, out_b = await asyncio.gather(first, second[0])
    assert isinstance(out_a, Ran) and isinstance(out_b, Ran), (out_a, out_b)
    assert out_a.value == out_b.value and ran == [{"n": 1}]
    assert len({r.idempotency_key for r in asked}) == 1  # one request: joined
    assert (await Rows.of(engine).verify_audit()).ok


SECRET = "hunter2-correct-horse-battery"
MASKED_POLICY = PolicyFile.model_validate({"tools": {
    "mcp:t/echo": {"policy": "auto", "sensitive": ["args.secret"]}}})


@pytest.mark.parametrize("how", ["succeeded", "failed", "cancelled_mid_call"])
async def test_a_kept_report_writes_what_a_report_read_first_writes(
        make_engine, how: str) -> None:
    """The report's reads (run and request locked, the intent read) are gone: written from
    what the request's write kept, it leaves the rows and the ``executed`` entry a report
    that reads them leaves (a request made without its start, as earlier versions made
    them: nothing kept). Succeeded, failed, and run after its run was cancelled mid-call
    (a call started before a cancel did run: its report is taken, the run stays
    cancelled). The masked arguments stay masked in every entry of the call."""
    from dataclasses import replace

    from approvald.bot.mcp.gateway import Ran
    from approvald.runtime.approvals.decide import Actor
    from approvald.runtime.runs.external import CALL_ID
    engine = make_engine(policy=MASKED_POLICY)
    g = _mcp_gateway(engine)
    assert isinstance(await g.call("echo", {"warm": 1}, _echo), Ran)
    seen = []
    for kept in (True, False):
        known = await _mcp_run_ids(engine)
        if not kept:
            new_request = g._new_request
            g._new_request = lambda *a, new_request=new_request: replace(
                new_request(*a), start_owner=None)

        async def server(args: dict[str, Any], known: set[str] = known) -> Any:
            if how == "cancelled_mid_call":
                rid = await _new_mcp_run(engine, known)
                assert await engine.cancel(rid, actor=Actor("U_OPS", "cli:ops"),
                                           reason="drill") == "cancelled"
            if how == "failed":
                return Ran("no", "failed", {"error": "boom"}, "the server said no")
            return Ran("yes", "succeeded", {"ok": True})

        args = {"secret": SECRET, "kept": kept}
        out = await g.call("echo", args, server)
        assert isinstance(out, Ran) and out.status == ("failed" if how == "failed"
                                                       else "succeeded"), out
        rid = await _new_mcp_run(engine, known)
        run = await Rows.of(engine).run(rid)
        ran = await Rows.of(engine).execution(rid, CALL_ID)
        entries = [e for e in await Rows.of(engine).audit() if e.run_id == rid]
        assert SECRET not in repr([e.details for e in entries])
        executed = [json.loads(e.details) for e in entries if e.action == "executed"]
        assert len(executed) == 1, entries
        [done] = executed
        assert done["args"]["secret"] != SECRET and done["args"]["kept"] is kept
        assert done.pop("idempotency_key") == f"{rid}:{CALL_ID}"
        done["args"].pop("kept")
        assert len(done.pop("masked")["args"]) == 64  # of the real values: theirs alone
        doc = await engine.request_document(await g.token(), rid)
        seen.append({
            "run": (run.status, run.result, run.error),
            "execution": (ran.status, ran.result, ran.error_class, ran.error,
                          ran.latency_ms, ran.finished_at is not None),
            "entries": [e.action for e in entries], "executed": done,
            "doc": (doc["status"], doc["result"]["status"], doc["result"]["result"],
                    doc["result"]["error"])})
    kept_one, read_one = seen
    assert kept_one == read_one
    assert kept_one["run"][0] == {"succeeded": "completed", "failed": "failed",
                                  "cancelled_mid_call": "cancelled"}[how]
    assert (await Rows.of(engine).verify_audit()).ok


async def test_a_kept_report_that_no_longer_holds_is_taken_as_any_report(
        make_engine, db_url: str, clock) -> None:
    """A report written from memory checks, in its statements, that what it kept still
    holds (the request not reported yet, its intent still started): here another process
    reported the call first. Nothing of it is written then (rolled back), and the report
    is taken as a report that reads: the same report again is not new, another result is
    refused (``already_reported``); one ``executed`` entry each. Kept reports that hold
    are recorded whether this process knows the chain's head (after a refused one, on
    PostgreSQL: the rows in a statement of their own, then the entry) or guessed it wrong
    (another process chained since: the rows ride, the entry waits for the head)."""
    from approvald.runtime.runs.external import ExternalError, Report
    engine, token = await setup(make_engine)
    other_db = Database(db_url, server_time=False)
    try:
        other = assemble(other_db, Registry([], policy=POLICY), clock=clock)
        docs = []
        for n in range(4):
            doc, new = await engine.open_request(token, NewRequest(
                tool="read_metrics", args={"n": n}, requested_by="U_DANA",
                start_owner="gw"))
            assert new and doc["status"] == "approved"
            docs.append((doc, Report("succeeded", doc["effective_digest"], {"rows": n}, None)))
        (d0, r0), (d1, r1), (d2, r2), (d3, r3) = docs
        assert await other.record_request_report(token, d0["id"], r0)
        assert await other.record_request_report(token, d1["id"], r1)
        assert not await engine.record_request_report(token, d0["id"], r0)
        assert await engine.record_request_report(token, d2["id"], r2)  # head unknown
        await other.open_request(token, NewRequest(  # the head moved elsewhere
            tool="read_metrics", args={"n": 9}, requested_by="U_DANA"))
        assert await engine.record_request_report(token, d3["id"], r3)  # guessed wrong
        with pytest.raises(ExternalError) as exc:
            await engine.record_request_report(token, d1["id"], Report(
                "succeeded", d1["effective_digest"], {"rows": 99}, None))
        assert exc.value.code == "already_reported"
        for doc, rep in docs:
            after = await engine.request_document(token, doc["id"])
            assert after["result"]["result"] == rep.result, after
            assert after["result"]["status"] == "succeeded"
            actions = [e.action for e in await Rows.of(engine).audit()
                       if e.run_id == doc["id"]]
            assert actions == ["requested", "approved", "executed"], actions
            run = await Rows.of(engine).run(doc["id"])
            assert run.status == "completed" and json.loads(run.result) == rep.result
        report = await Rows.of(engine).verify_audit()
        assert report.ok, report.problems
    finally:
        await other_db.close()


async def test_an_mcp_auto_call_given_up_once_started_still_runs_and_is_recorded(
        make_engine) -> None:
    """A client that gives up (its call cancelled) once its request's write, which
    records the call's start, is under way: the call still runs, once, and its result is
    recorded (never a start left behind with nothing running it). A client of the same
    call that gives up while it waits for its turn asks nothing."""
    from approvald.bot.mcp.gateway import Ran
    from approvald.runtime.runs.external import CALL_ID
    engine = make_engine(policy=MCP_POLICY)
    g = _mcp_gateway(engine)
    assert isinstance(await g.call("echo", {"warm": 1}, _echo), Ran)
    known = await _mcp_run_ids(engine)
    opened, written, go = engine.open_request, asyncio.Event(), asyncio.Event()

    async def open_request(token: Any, req: Any, **kw: Any) -> Any:
        out = await opened(token, req, **kw)
        written.set()
        await go.wait()
        return out

    engine.open_request = open_request  # type: ignore[method-assign]
    ran: list[dict[str, Any]] = []

    async def server(args: dict[str, Any]) -> Any:
        ran.append(args)
        return await _echo(args)

    first = asyncio.ensure_future(g.call("echo", {"n": 1}, server))
    await written.wait()
    waiting = asyncio.ensure_future(g.call("echo", {"n": 1}, server))
    for _ in range(20):
        await asyncio.sleep(0)
    waiting.cancel()
    first.cancel()
    await asyncio.gather(first, waiting, return_exceptions=True)
    assert first.cancelled() and waiting.cancelled()
    engine.open_request = opened  # type: ignore[method-assign]
    go.set()
    rid = await _new_mcp_run(engine, known)

    async def recorded() -> Any:
        done = await Rows.of(engine).execution(rid, CALL_ID)
        return done if done is not None and done.status == "succeeded" else None

    from tests.integration.slack_harness import wait_for
    await wait_for(recorded, what="the given-up call's result")
    assert ran == [{"n": 1}]
    assert await _mcp_run_ids(engine) - known == {rid}  # the one waiting asked nothing
    assert (await Rows.of(engine).verify_audit()).ok
