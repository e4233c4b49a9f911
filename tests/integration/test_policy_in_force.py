"""Which policy was in force is read from the audit log alone (issue 52.9): its digest is
the policy file's SHA-256 (the recipe is tested here, as the docs give it), the
``policy_loaded`` entry holds its text, a run's export carries the policies its requests
name, and each serving process picks up a changed file and audits its own load, so two
policies are never in force unnoticed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.runtime.policies.policy import PolicyFile, load_policy_file
from approvald.runtime.record import audit
from approvald.store.db import Database

from tests.helpers import Rows

POLICY = '[tools.issue_refund]\r\npolicy = "approve_before"\r\nwhy = "money moves"\r\n'


def test_the_digest_is_the_files_sha256_and_the_text_is_the_files(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_bytes(POLICY.encode())  # CRLF kept: the digest is of the bytes
    policy = load_policy_file(path)
    assert policy.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert policy.text == POLICY
    # no file: the SHA-256 of the canonical JSON of its fields, the text recorded
    builtin = PolicyFile()
    assert builtin.digest == hashlib.sha256(builtin.text.encode()).hexdigest()
    assert json.loads(builtin.text) == builtin.model_dump(mode="json")


def _settings(url: str, tmp_path: Path, policy: Path) -> Settings:
    return Settings(APPROVALD_DATABASE_URL=url, APPROVALD_HOST="127.0.0.1",
                    APPROVALD_PORT="0", APPROVALD_POLL_INTERVAL="600",
                    APPROVALD_METRICS_ADDR="off", APPROVALD_POLICY_FILE=str(policy),
                    APPROVALD_DEMO_LEDGER=str(tmp_path / "ledger.jsonl"))


async def _loads(db: Database) -> list[dict]:
    return [{"actor": e.actor, **json.loads(e.details)}
            for e in await Rows(db).audit() if e.action == "policy_loaded"]


async def test_each_process_picks_up_a_changed_policy_and_audits_its_load(
        sqlite_url: str, tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[tools.issue_refund]\npolicy = "approve_before"\n')
    first = hashlib.sha256(path.read_bytes()).hexdigest()
    db = Database(sqlite_url)
    a = Service(_settings(sqlite_url, tmp_path, path), db)
    b = Service(_settings(sqlite_url, tmp_path, path), db)
    try:
        await a.start()
        await b.start()
        loads = await _loads(db)
        # each process's load is on record, with its id and the text
        assert [(x["process"], x["digest"]) for x in loads] == [
            (a.engine.process, first), (b.engine.process, first)]
        assert all(x["actor"] == f"process:{x['process']}" for x in loads)
        assert loads[0]["text"] == path.read_text()
        assert await a.reload_policy() is False  # unchanged: nothing read, nothing audited

        path.write_text('[tools.issue_refund]\npolicy = "approve_before"\nwhy = "new"\n')
        second = hashlib.sha256(path.read_bytes()).hexdigest()
        assert await a.reload_policy() is True
        assert a.engine.policy_file().digest == second
        assert await b.reload_policy() is True
        loads = await _loads(db)
        assert [(x["process"], x["digest"], x["previous"]) for x in loads[2:]] == [
            (a.engine.process, second, first), (b.engine.process, second, second)]

        path.write_text("[tools.issue_refund]\npolicy = \"nonsense\"\n")  # does not load
        assert await a.reload_policy() is False
        assert a.engine.policy_file().digest == second  # the one in force is kept
        assert len(await _loads(db)) == 4
        assert (await audit.verify(db)).ok
    finally:
        await b.stop()
        await a.stop()
        await db.close()


def test_each_command_that_acts_under_another_policy_is_on_record(
        sqlite_url: str, tmp_path: Path) -> None:
    """A short-lived CLI process that opens or decides requests records the policy it
    used: whenever its file is not the one in force, its own ``policy_loaded`` entry (its
    process, ``lifetime: command``, the policy in force beside it), every time, and it
    never passes its file off as the one in force; a command under the policy in force
    writes nothing."""
    from tests.helpers import make_cli

    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    served = tmp_path / "served.toml"
    served.write_text('[tools.issue_refund]\npolicy = "approve_before"\n')
    other = tmp_path / "other.toml"
    other.write_text('[tools.issue_refund]\npolicy = "approve_before"\nwhy = "other"\n')
    a = hashlib.sha256(served.read_bytes()).hexdigest()
    b = hashlib.sha256(other.read_bytes()).hexdigest()

    def act(policy: Path) -> None:
        cli.env_extra["APPROVALD_POLICY_FILE"] = str(policy)
        cli.ok("run", "demo-refund", "--task", "Refund order A-1001",
               "--requested-by", "U_DANA")

    def loads() -> list[dict]:
        return [r["details"] for r in map(json.loads, cli.ok("audit", "export").splitlines())
                if r["action"] == "policy_loaded"]

    def requests_under() -> list[str]:
        return [r["details"]["policy_file"]
                for r in map(json.loads, cli.ok("audit", "export").splitlines())
                if r["action"] == "requested" and r["details"].get("kind") == "tool_call"]

    act(served)  # the first on record: in force
    act(served)  # the policy in force: nothing more
    assert [(x["digest"], x["previous"]) for x in loads()] == [(a, None)]
    act(other)
    act(other)  # each command under another file, every time
    later = loads()[1:]
    assert [(x["digest"], x["previous"], x["in_force"], x["lifetime"]) for x in later] == [
        (b, a, a, "command")] * 2
    assert later[0]["process"] != later[1]["process"]
    assert later[0]["text"] == other.read_text()
    act(served)
    assert len(loads()) == 3  # the one in force was never replaced by a command's
    # every request names the file it was made under, and that file's text is on record
    assert requests_under() == [a, a, b, b, a]
    assert {x["digest"] for x in loads()} == {a, b}
