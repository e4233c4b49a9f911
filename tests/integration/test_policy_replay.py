"""A policy change checked against the record (issue 51).

A history is made through several faces: Slack clicks on an agent's cards (approved,
edited, denied; a card number and an authorisation code sealed and masked), HTTP API
requests decided from the command line (approved, denied with a reason), and Claude
Code's hook (a command approved and one denied from the command line). Three new policy
files are then replayed over it with ``approvald policy replay`` (a looser one, a stricter
one, one with other approvers): each changed request is listed with what happened and
what would happen now, the exit status is 7 exactly when a call a person denied or edited
would run without asking, and no masked value is ever printed. The shadow rules of the
policy in force were evaluated on every matching request, recorded with whether people
agreed, and enforced nowhere: every face still asked.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.acceptance.test_cli_hook import aclaude
from tests.helpers import Cli, Rows, make_cli, parts
from tests.integration.slack_harness import Harness, harness, wait_for
from tests.integration.test_http_api import api, approval_of, base, make_token
from tests.integration.test_sealed_at_rest import KEY_1
from tests.integration.test_sensitive_args import AUTH, card_agent, ended, leaks, walk

# the policy in force while the history is made: shadow rules on three faces
POLICY = """
[tools.issue_refund]
approvers = ["U_ALICE"]
[[tools.issue_refund.rules]]
when = "args.amount_cents <= 5000"
policy = "auto"
mode = "shadow"

[tools."api:*/deploy"]
approvers = ["U_ALICE"]
[[tools."api:*/deploy".rules]]
when = 'args.service == "docs"'
policy = "auto"
mode = "shadow"

[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]
[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("make")'
policy = "auto"
mode = "shadow"
"""

LOOSER = """
[tools.refund_card]
policy = "auto"
[tools."api:*/deploy"]
policy = "auto"
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]
[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("make")'
policy = "auto"
"""

STRICTER = """
[tools.refund_card]
[[tools.refund_card.rules]]
when = "args.amount_cents > 1000"
policy = "forbidden"
reason = "card refunds go through finance"
[tools."api:*/deploy"]
approvers = ["U_ALICE"]
"""

OTHERS = """
[tools.issue_refund]
approvers = ["U_ALICE"]
[tools.refund_card]
approvers = ["U_BOB", "U_CAROL"]
quorum = 2
[tools."api:*/deploy"]
approvers = ["U_ALICE"]
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]
"""


# the command line on serve's clock (the system's): a request the hook makes on the
# clock file's time would be past its expiry for serve's sweeper, which runs on while the
# commands do
SAME_CLOCK = {"APPROVALD_CLOCK_FILE": ""}


async def ran(cli: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    return await cli.acall(*args, APPROVALD_DATA_KEY=KEY_1)


async def make_history(h: Harness, cli: Cli, hook_env: dict[str, str]) -> dict[str, Any]:
    """The faces' requests; what became of each, by name."""
    made: dict[str, Any] = {}
    # Slack clicks: an agent's card refunds (the card number and auth code sealed)
    parts(h.engine).registry.add(card_agent([]))
    made["cards"] = await walk(h, (("A-1", "approve"), ("A-2", "edit"), ("A-3", "deny")))
    # an agent's refund the shadow rule would run: still asked, approved in Slack
    paused = await h.pause_refund()
    await h.card(paused.approval_ids[0])
    made["refund_asked"] = (await h.approval(paused.approval_ids[0])).status
    # serve (running on meanwhile) resumes it: the command only decides
    assert (await ran(cli, "approvals", "approve", paused.approval_ids[0],
                      "--as", "U_ALICE", "--no-resume")).returncode == 0
    await wait_for(lambda: ended(h, paused.run_id), what="the refund to end")
    # the HTTP API: three deploys, decided from the command line
    token = await make_token(h, "ci")
    async with aiohttp.ClientSession() as http:
        docs = []
        for service in ("api", "docs", "docs"):
            status, doc = await api(http, "POST", f"{base(h)}/v1/requests", token.token,
                                    {"tool": "deploy", "args": {"service": service},
                                     "requested_by": "U_DANA"})
            assert status == 201, doc
            docs.append(doc)
    made["api_statuses"] = [d["status"] for d in docs]
    for doc, verdict in zip(docs, ("approve", "deny", "approve"), strict=True):
        a = await approval_of(h, doc["id"])
        extra = ("--reason", "docs freeze this week") if verdict == "deny" else ()
        done = await ran(cli, "approvals", verdict, a.id, "--as", "U_ALICE", *extra)
        assert done.returncode == 0, done.stderr
    # Claude Code's hook: two commands, asked, decided from the command line
    hooked = []
    for use, command in (("toolu_01", "make release"), ("toolu_02", "rm -rf build")):
        for _ in range(3):  # a loaded machine can exceed the hook's budget: it denies, so
            code, out, _ = await aclaude(cli, "Bash", {"command": command}, use=use, **hook_env)
            assert code == 0 and out["hookSpecificOutput"]["permissionDecision"] == "deny"
            said = out["hookSpecificOutput"]["permissionDecisionReason"]
            if "could not decide" not in said:  # ... and the same call again joins it
                break
        hooked.append(said)
    made["hook_said"] = hooked
    pending = json.loads((await ran(cli, "approvals", "list", "--json")).stdout)
    for a in pending:
        verdict = "approve" if a["args"]["command"].startswith("make") else "deny"
        extra = ("--reason", "not on a shared box") if verdict == "deny" else ()
        assert (await ran(cli, "approvals", verdict, a["id"], "--as", "U_ALICE",
                          *extra)).returncode == 0
    return made


async def replayed(cli: Cli, path: Path) -> tuple[int, str, list[dict[str, Any]]]:
    text = await ran(cli, "policy", "replay", str(path), "--since", "all")
    docs = await ran(cli, "policy", "replay", str(path), "--since", "all", "--json")
    assert docs.returncode == text.returncode, (docs.stderr, text.stderr)
    return text.returncode, text.stdout + text.stderr, \
        [json.loads(x) for x in docs.stdout.splitlines()]


def by_policy(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["policy"], d["outcome"]): d for d in docs}


@pytest.mark.slow
async def test_three_policies_replayed_over_a_history_made_through_the_faces(
        sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    policy = {"APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml")}
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    cli.env_extra.update(policy)
    cli.env_extra.update(SAME_CLOCK)
    async with harness(sqlite_url, tmp_path, APPROVALD_DATA_KEY=KEY_1, **policy) as h:
        made = await make_history(h, cli, policy)
    # shadow rules enforced nowhere: every face still asked
    assert made["refund_asked"] == "pending"
    assert made["api_statuses"] == ["pending"] * 3
    assert all("waiting for approval" in said for said in made["hook_said"]), made["hook_said"]

    # looser: runs without asking what people denied and edited -> exit 8, listed
    (tmp_path / "looser.toml").write_text(LOOSER)
    code, out, docs = await replayed(cli, tmp_path / "looser.toml")
    assert code == 8, out
    assert "DANGER: " in out
    found = by_policy(docs)
    edited = found[("refund_card", "edited")]
    assert (edited["change"], edited["dangerous"], edited["now"]["policy"]) == (
        "runs_unasked", True, "auto")
    assert found[("refund_card", "denied")]["dangerous"] is True
    assert found[("refund_card", "approved")]["dangerous"] is False
    denied = found[("api:ci/deploy", "denied")]
    assert denied["dangerous"] and denied["reason"] == "docs freeze this week"
    assert denied["args"] == {"service": "docs"} and denied["decided_by"] == "U_ALICE"
    hook = [d for d in docs if d["policy"] == "hook:claude-code/Bash"]
    # only "make" runs unasked under the looser file's rule; "rm" still asks Alice
    assert [(d["args"]["command"], d["outcome"], d["dangerous"]) for d in hook] == [
        ("make release", "approved", False)]
    # the demo refund, which the looser file does not name, goes to its code's approvers
    assert {(d["policy"], d["change"]) for d in docs if d["change"] != "runs_unasked"} == {
        ("issue_refund", "approvers")}
    # masked values never shown, in the summary or the documents
    assert not leaks(out) and not leaks(docs) and AUTH not in out + json.dumps(docs)
    assert "•••• 4242" in json.dumps(found[("refund_card", "denied")]["args"],
                                     ensure_ascii=False)

    # stricter: approved card refunds would be forbidden; nothing runs unasked -> exit 0
    (tmp_path / "stricter.toml").write_text(STRICTER)
    code, out, docs = await replayed(cli, tmp_path / "stricter.toml")
    assert code == 0, out
    assert "OK: no call a person denied or edited would run without asking" in out
    changes = {(d["policy"], d["outcome"], d["change"]) for d in docs}
    assert ("refund_card", "approved", "forbidden") in changes
    assert ("refund_card", "edited", "forbidden") in changes
    assert all(d["now"]["reason"] == "card refunds go through finance"
               for d in docs if d["policy"] == "refund_card")
    # the hook's Bash falls to [default] (anyone but the requester): other approvers
    assert {d["change"] for d in docs if d["policy"] == "hook:claude-code/Bash"} == \
        {"approvers"}
    assert not leaks(out) and not leaks(docs)

    # other approvers: the card refunds go to Bob and Carol, two of them
    (tmp_path / "others.toml").write_text(OTHERS)
    code, out, docs = await replayed(cli, tmp_path / "others.toml")
    assert code == 0, out
    assert sorted((d["policy"], d["change"]) for d in docs) == [
        ("refund_card", "approvers")] * 3
    assert all((d["now"]["approvers"], d["now"]["quorum"]) == (["U_BOB", "U_CAROL"], 2)
               for d in docs)
    assert not leaks(out) and not leaks(docs)

    # policy check: the same verdict for CI, and the file alone when not asked more
    assert (await ran(cli, "policy", "check", str(tmp_path / "looser.toml"),
                      "--against-history", "--since", "all")).returncode == 8
    assert (await ran(cli, "policy", "check", str(tmp_path / "looser.toml"))).returncode == 0

    # the shadow rules' records, with how often people agreed
    shown = json.loads((await ran(cli, "insights", "--since", "all", "--json")).stdout)
    shadow = {s["where"]: s for s in shown["shadow"]}
    assert (shadow["tools.api:*/deploy.rules[0]"]["matched"],
            shadow["tools.api:*/deploy.rules[0]"]["agreed"]) == (2, 1)
    assert shadow["tools.issue_refund.rules[0]"]["agreement"] == 1.0
    assert shadow["tools.hook:claude-code/Bash.rules[0]"]["matched"] == 1
    tools = {t["name"]: t for t in shown["tools"]}
    assert tools["refund_card"]["outcomes"] == {"approved": 1, "denied": 1, "edited": 1}
    assert tools["api:ci/deploy"]["top_denial_reasons"] == [
        {"reason": "docs freeze this week", "count": 1}]
    assert tools["api:ci/deploy"]["asked_of"] == {"U_ALICE": 3}
    assert not leaks(shown)
    text = await ran(cli, "insights", "--since", "all")
    assert text.returncode == 0 and "people agreed on 1 of 2 (50%)" in text.stdout


async def test_bad_input_is_refused_and_a_broken_chain_is_never_read(
        sqlite_url: str, tmp_path: Path) -> None:
    from approvald.store.db import Database
    from approvald.store.models import AuditEntry

    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    (tmp_path / "bad.toml").write_text('[tools."api:*/deploy"]\nquorum = "two"\n')
    (tmp_path / "good.toml").write_text('[tools."api:*/deploy"]\npolicy = "auto"\n')
    bad = await cli.acall("policy", "replay", str(tmp_path / "bad.toml"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "the new policy file: " in bad.stderr and "tools.api:*/deploy.quorum" in bad.stderr
    since = await cli.acall("insights", "--since", "last week")
    assert since.returncode == 2 and "--since: not a duration" in since.stderr
    empty = await cli.acall("policy", "replay", str(tmp_path / "good.toml"), "--since", "all")
    assert empty.returncode == 0 and "over 0 requests" in empty.stdout, empty.stdout
    # an entry on the record (a token made), then rewritten behind the chain's back
    made = await cli.acall("tokens", "create", "ci", "--tools", "deploy", "--json",
                           APPROVALD_SECRET="approvald-test-secret-0123456789")
    token = json.loads(made.stdout)
    assert token["name"] == "ci"
    db = Database(sqlite_url)
    try:
        await Rows(db).forge(AuditEntry, AuditEntry.seq == 1, actor="someone")
    finally:
        await db.close()
    broken = await cli.acall("policy", "check", str(tmp_path / "good.toml"), "--against-history")
    assert broken.returncode == 5 and "audit log BROKEN" in broken.stdout, broken.stdout
    assert (await cli.acall("insights")).returncode == 5


async def test_the_readers_verify_from_the_checkpoint_audit_verify_records_and_full_walks_it_all(
        sqlite_url: str, tmp_path: Path) -> None:
    """`audit verify` records the verified-through checkpoint; `insights` then trusts the
    entries before it (the documented trade-off), while `--full` and `audit verify` walk
    and recompute the whole chain."""
    from approvald.store.db import Database
    from approvald.store.models import AuditEntry

    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    keyed = {"APPROVALD_AUDIT_KEY": "audit-key-kept-in-a-vault-0123456789",
             "APPROVALD_SECRET": "approvald-test-secret-0123456789"}
    for name in ("ci", "ci-2"):
        made = await cli.acall("tokens", "create", name, "--tools", "deploy", **keyed)
        assert made.returncode == 0
    assert (await cli.acall("audit", "verify", **keyed)).returncode == 0  # records the checkpoint
    made = await cli.acall("tokens", "create", "cd", "--tools", "deploy", **keyed)
    assert made.returncode == 0
    db = Database(sqlite_url)
    try:
        await Rows(db).forge(AuditEntry, AuditEntry.seq == 1, actor="someone")
    finally:
        await db.close()
    # entry 1 is before the checkpoint: not rechecked by a reader that trusts it
    assert (await cli.acall("insights", **keyed)).returncode == 0
    full = await cli.acall("insights", "--full", **keyed)
    assert full.returncode == 5 and "entry 1 " in full.stdout, full.stdout
    (tmp_path / "new.toml").write_text('[tools."api:*/deploy"]\npolicy = "auto"\n')
    replay = await cli.acall("policy", "replay", str(tmp_path / "new.toml"), **keyed)
    assert replay.returncode == 0
    replay = await cli.acall("policy", "replay", str(tmp_path / "new.toml"), "--full", **keyed)
    assert replay.returncode == 5 and "audit log BROKEN" in replay.stdout, replay.stdout
    assert (await cli.acall("audit", "verify", **keyed)).returncode == 5


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
async def test_the_kept_requests_give_the_documents_a_fold_of_every_entry_gives(
        db_url: str, tmp_path: Path) -> None:
    """The same history, through the faces, with the audit key: a read keeps its requests
    folded (``audit_requests``), a later one takes them and folds only the entries after
    them; its replays and insights are those of a fold of every entry (``--full``), byte
    for byte. What is kept is as masked as the entries; a kept request edited by hand is
    reported and not used."""
    from approvald.store.db import Database
    from approvald.store.models import AuditRequest

    (tmp_path / "policy.toml").write_text(POLICY)
    env = {"APPROVALD_POLICY_FILE": str(tmp_path / "policy.toml"),
           "APPROVALD_AUDIT_KEY": "audit-key-kept-in-a-vault-0123456789"}
    cli = make_cli(db_url, tmp_path, in_process=True)
    cli.env_extra.update(env)
    cli.env_extra.update(SAME_CLOCK)
    async with harness(db_url, tmp_path, APPROVALD_DATA_KEY=KEY_1, **env) as h:
        await make_history(h, cli, env)
        first = await ran(cli, "insights", "--since", "all", "--json")  # folds it all, keeps it
        assert first.returncode == 0 and not first.stderr, first.stderr
        # then more: a deploy asked and denied after the keep (folded from its entries)
        token = await make_token(h, "cd")
        async with aiohttp.ClientSession() as http:
            status, doc = await api(http, "POST", f"{base(h)}/v1/requests", token.token,
                                    {"tool": "deploy", "args": {"service": "web"},
                                     "requested_by": "U_DANA"})
        assert status == 201, doc
        a = await approval_of(h, doc["id"])
        assert (await ran(cli, "approvals", "deny", a.id, "--as", "U_ALICE", "--reason",
                          "not on a Friday")).returncode == 0
    db = Database(db_url)
    try:
        kept = await Rows(db).kept_requests()
    finally:
        await db.close()
    assert kept and not leaks([k[2] for k in kept])
    assert AUTH not in json.dumps([k[2] for k in kept])

    async def both(*args: str) -> tuple[subprocess.CompletedProcess[str], ...]:
        return await ran(cli, *args), await ran(cli, *args, "--full")

    for name, text in (("looser", LOOSER), ("stricter", STRICTER), ("others", OTHERS)):
        (tmp_path / f"{name}.toml").write_text(text)
        fast, full = await both("policy", "replay", str(tmp_path / f"{name}.toml"), "--since",
                                "all", "--json")
        assert (fast.returncode, fast.stdout) == (full.returncode, full.stdout), name
        assert fast.stdout and not fast.stderr, fast.stderr
    fast, full = await both("insights", "--since", "all", "--json")
    assert fast.returncode == full.returncode == 0 and fast.stdout == full.stdout
    shown = json.loads(fast.stdout)
    tools = {t["name"]: t for t in shown["tools"]}
    assert {r["reason"] for r in tools["api:cd/deploy"]["top_denial_reasons"]} == {
        "not on a Friday"}
    assert {r["reason"] for r in tools["api:ci/deploy"]["top_denial_reasons"]} == {
        "docs freeze this week"}

    # a kept request edited by hand (a denial made an approval): caught, not used
    db = Database(db_url)
    try:
        denied = next(k for k in await Rows(db).kept_requests() if '"not on a Friday"' in k[2])
        await Rows(db).forge(AuditRequest, AuditRequest.seq == denied[0],
                             state=denied[2].replace('"denied"', '"approved"'))
    finally:
        await db.close()
    caught = await ran(cli, "insights", "--since", "all", "--json")
    assert caught.returncode == 0 and caught.stdout == full.stdout
    assert f"audit log WARNING: 1 kept request(s) do not match their MAC (first at entry " \
        f"{denied[0]})" in caught.stderr, caught.stderr
