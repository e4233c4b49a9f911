"""Policy files: durations, percentages, ladders, and one clear error per bad key."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.policies.policy import (
    ApprovalPolicy,
    Rung,
    format_duration,
    load_policy_file,
    parse_duration,
)
from approvald.runtime.runs.agent import Registry
from approvald.runtime.runs.demo import demo_agents

EXAMPLE = '''
[tools.issue_refund]
approvers = ["U_ALICE", "S_FINANCE"]
quorum = 1
allow_self_approval = false
ttl = "30m"
reminders = ["50%", "90%"]
on_expire = "escalate"
escalate = [{ approvers = ["U_CFO"], ttl = "1h" }]
risk = "high"
channel = "C_FINANCE"

[groups]
S_FINANCE = ["U_BOB", "U_CAROL"]
'''


@pytest.mark.parametrize("text,seconds", [
    ("30m", 1800), ("1h", 3600), ("1h30m", 5400), ("45s", 45), ("2d", 172800), (90, 90),
    ("1.5h", 5400), (" 10 m ", 600),
])
def test_durations(text: object, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert parse_duration(format_duration(timedelta(seconds=seconds))).total_seconds() == seconds


@pytest.mark.parametrize("bad", ["", "soon", "30", "m30", "-5m", "0s", "5m later", True, None])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_the_documented_example_loads_and_applies(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(EXAMPLE)
    policy = load_policy_file(path)
    registry = Registry(demo_agents(), policy=policy)
    registry.check_policy()
    refund = registry.get("demo-refund").tool("issue_refund")
    assert refund is not None
    kind, effective = policy.effective("issue_refund", refund.policy, refund.approval)
    assert kind == "approve_before"
    assert effective.approvers == ["U_ALICE", "S_FINANCE"]
    assert effective.ttl == timedelta(minutes=30) and effective.reminders == [0.5, 0.9]
    assert effective.rung(1) == (["U_CFO"], timedelta(hours=1), 1)
    assert effective.rungs == 2 and effective.channel == "C_FINANCE"
    assert policy.groups == {"S_FINANCE": ["U_BOB", "U_CAROL"]}
    snap = ApprovalPolicy.from_snapshot(effective.snapshot())
    assert snap == effective  # snapshots round-trip exactly


@pytest.mark.parametrize("text,message", [
    ("[tools.issue_refund]\nttl = \"soon\"\n",
     "tools.issue_refund.ttl: not a duration"),
    ("[tools.issue_refund]\ncolour = \"red\"\n", "tools.issue_refund.colour: Extra inputs"),
    ("[tools.issue_refund]\nreminders = [\"150%\"]\n", "tools.issue_refund.reminders"),
    ("[tools.issue_refund]\non_expire = \"approve\"\n", "tools.issue_refund.on_expire"),
    ("[tools.issue_refund]\non_expire = \"escalate\"\n", "needs an escalate ladder"),
    ("[tools.issue_refund]\napprovers = [\"U_A\"]\nquorum = 2\n", "quorum 2 needs more approvers"),
    ("[tools.no_such_tool]\nttl = \"1h\"\n", "no agent defines a tool named 'no_such_tool'"),
    ("[surprise]\nx = 1\n", "surprise: Extra inputs"),
    ("this is = = not toml", "not valid TOML"),
    # policies that could never be satisfied (issue 8, defect 13)
    ("[tools.issue_refund]\napprovers = [\"U_A\", \"u_a\"]\nquorum = 2\n",
     "tools.issue_refund: quorum 2 needs more approvers than the 1 listed"),
    ('[tools.issue_refund]\non_expire = "escalate"\n'
     'escalate = [{ approvers = ["U_CFO", "U_CEO"], ttl = "1h", quorum = 3 }]\n',
     "tools.issue_refund.escalate[0]: quorum 3 needs more approvers than the 2"),
    ('[tools.issue_refund]\non_expire = "escalate"\nescalate = [{ approvers = ["U_CFO"], '
     'ttl = "1h" }, { approvers = ["U_CEO"], ttl = "1h", quorum = 2 }]\n',
     "tools.issue_refund.escalate[1]: quorum 2 needs more approvers than the 1"),
    ('[tools.issue_refund]\non_expire = "cancel"\n'
     'escalate = [{ approvers = ["U_CFO"], ttl = "1h" }]\n',
     "tools.issue_refund.escalate: an escalate ladder is never used with "
     "on_expire = 'cancel'"),
    ('[tools.issue_refund]\nescalate = [{ approvers = ["U_CFO"], ttl = "1h" }]\n',
     "tools.issue_refund.escalate: an escalate ladder is never used"),  # code: cancel
    ('[tools.issue_refund]\napprovers = ["U_ALICE", "finance"]\n',
     "tools.issue_refund.approvers[1]: 'finance' is not a Slack user or user-group "
     "id (expected U…, W… or S…"),
    ('[tools.issue_refund]\napprovers = ["<!channel>"]\n',
     "tools.issue_refund.approvers[0]: '<!channel>' is not a Slack user or"),
    ('[tools.issue_refund]\napprovers = [""]\n', "tools.issue_refund.approvers[0]: "),
    ('[tools.issue_refund]\napprovers = ["C_FINANCE"]\n', "tools.issue_refund.approvers[0]: "),
    ('[tools.issue_refund]\non_expire = "escalate"\n'
     'escalate = [{ approvers = ["cfo@example.com"], ttl = "1h" }]\n',
     "tools.issue_refund.escalate[0].approvers[0]: 'cfo@example.com' is not a Slack"),
    ('[groups]\nfinance = ["U_BOB"]\n',
     "groups.finance: 'finance' is not a Slack user-group id (expected S…"),
    ('[groups]\nU_BOB = ["U_CAROL"]\n', "groups.U_BOB: 'U_BOB' is not a Slack user-"),
    ('[groups]\nS_FINANCE = ["U_BOB", "carol"]\n',
     "groups.S_FINANCE[1]: 'carol' is not a Slack user id (expected U… or W…"),
    ('[groups]\nS_FINANCE = ["S_AUDIT"]\n',
     "groups.S_FINANCE[0]: 'S_AUDIT' is not a Slack user id"),
])
def test_bad_policy_files_are_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        Registry(demo_agents(), policy=load_policy_file(path)).check_policy()
    assert message in str(err.value)
    assert str(err.value).startswith("APPROVALD_POLICY_FILE: ")
    assert "\n" not in str(err.value)


def test_ids_in_a_policy_file_are_normalised(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[tools.issue_refund]\n'
                    'approvers = ["u_alice", " <@U_DAVE|dave> ", "s_finance"]\n'
                    'quorum = 2\non_expire = "escalate"\n'
                    'escalate = [{ approvers = ["u_cfo", "S_EXEC"], ttl = "1h", quorum = 3 }]\n'
                    '[groups]\ns_finance = ["u_bob", "U_CAROL"]\n')
    policy = load_policy_file(path)
    refund = Registry(demo_agents(), policy=policy).get("demo-refund").tool("issue_refund")
    assert refund is not None
    _, effective = policy.effective("issue_refund", refund.policy, refund.approval)
    assert effective.approvers == ["U_ALICE", "U_DAVE", "S_FINANCE"]
    assert effective.rung(1) == (["U_CFO", "S_EXEC"], timedelta(hours=1), 3)  # a group: may
    assert policy.groups == {"S_FINANCE": ["U_BOB", "U_CAROL"]}


def test_anyone_but_the_requester_stays_valid(tmp_path: Path) -> None:
    assert ApprovalPolicy(approvers=[], quorum=2).approvers == []
    path = tmp_path / "policy.toml"
    path.write_text("[tools.issue_refund]\napprovers = []\nquorum = 3\n")
    policy = load_policy_file(path)
    Registry(demo_agents(), policy=policy).check_policy()


def test_a_file_that_cancels_on_expiry_turns_the_codes_ladder_off(tmp_path: Path) -> None:
    base = ApprovalPolicy(approvers=["U_ALICE"], on_expire="escalate",
                          escalate=[Rung(approvers=["U_CFO"], ttl="1h")])
    path = tmp_path / "policy.toml"
    path.write_text('[tools.issue_refund]\non_expire = "cancel"\n')
    _, effective = load_policy_file(path).effective("issue_refund", "approve_before", base)
    assert effective.on_expire == "cancel" and effective.escalate == [] and effective.rungs == 1


@pytest.mark.parametrize("declare", [
    lambda: Rung(approvers=["U_CFO"], ttl="1h", quorum=2),
    lambda: ApprovalPolicy(escalate=[Rung(approvers=["U_CFO"], ttl="1h")]),
    lambda: ApprovalPolicy(approvers=["cli:dana"]),
    lambda: ApprovalPolicy(on_expire="escalate", escalate=[Rung(approvers=["@cfo"], ttl="1h")]),
])
def test_policies_declared_in_code_follow_the_same_rules(declare: Callable[[], object]) -> None:
    with pytest.raises(ValueError):  # pydantic's ValidationError
        declare()


def test_stored_snapshots_are_read_by_the_rules_they_were_written_under() -> None:
    # written before ids, rung quorums and unused ladders were checked: the stored request
    # decides (invariant 12), so reading it back must neither fail nor change it
    legacy = {"approvers": ["u_alice", "ops@example"], "quorum": 1, "ttl": "30m",
              "reminders": [0.5], "on_expire": "cancel", "risk": "high",
              "escalate": [{"approvers": ["cfo", "ceo"], "ttl": "1h", "quorum": 5}]}
    for stored in (legacy, json.dumps(legacy)):
        policy = ApprovalPolicy.from_snapshot(stored)
        assert policy.approvers == ["u_alice", "ops@example"]
        assert policy.escalate[0].approvers == ["cfo", "ceo"] and policy.rungs == 1
    fresh = ApprovalPolicy(approvers=["u_alice"])
    assert ApprovalPolicy.from_snapshot(fresh.snapshot()).approvers == ["U_ALICE"]


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy_file(tmp_path / "nope.toml")


def test_silence_cannot_be_configured_to_approve() -> None:
    with pytest.raises(ValueError):
        ApprovalPolicy.model_validate({"on_expire": "approve"})


def test_edits_mode_is_a_policy_key_and_lands_in_the_snapshot(tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[tools.issue_refund]\nedits = "propose"\n')
    pf = load_policy_file(path)
    _, policy = pf.effective("issue_refund", "approve_before", ApprovalPolicy())
    assert policy.edits == "propose" and policy.snapshot()["edits"] == "propose"
    assert ApprovalPolicy().edits == "approve"  # the default: an edit is an approval
    path.write_text('[tools.issue_refund]\nedits = "silently"\n')
    with pytest.raises(ConfigError, match=r"tools\.issue_refund\.edits"):
        load_policy_file(path)


@pytest.mark.parametrize(("when", "line"), [
    ("args.cnets > 100", "tools.issue_refund.rules[0].when: args.cnets: issue_refund has no "
                         "argument 'cnets' (arguments: order_id, amount_cents, reason)"),
    ("args.amount_cents <= '2000'", "tools.issue_refund.rules[0].when: args.amount_cents <= "
                                    "'2000': <= is not defined for an integer "
                                    "(args.amount_cents) and a string ('2000')"),
])
def test_a_rule_that_fails_on_every_call_of_its_tool_stops_start_up(
        tmp_path: Path, when: str, line: str) -> None:
    # before: the rule loaded, and every call of issue_refund was forbidden, including
    # those the rule was meant to send to a person
    path = tmp_path / "policy.toml"
    path.write_text(f'[[tools.issue_refund.rules]]\nwhen = "{when}"\n'
                    'approvers = ["U_BOB"]\n')
    policy = load_policy_file(path)
    with pytest.raises(ConfigError) as err:
        Registry(demo_agents(), policy=policy)
    assert str(err.value) == f"APPROVALD_POLICY_FILE: {path}: {line}"
    refund = demo_agents()[0].tool("issue_refund")
    assert refund is not None
    chosen = policy.for_call("issue_refund", refund.policy, refund.approval,
                             {"order_id": "A-1", "amount_cents": 150000, "reason": "dup"})
    assert chosen.kind == "forbidden"  # what start-up now refuses to let happen


def test_rules_that_fit_their_tool_still_load(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text((Path(__file__).parents[1] / "fixtures" / "refund_rules.toml").read_text()
                    + '[[tools.issue_refund.rules]]\n'
                      'when = "args.reason.startsWith(\'dup\') && args.amount_cents > 10.5 '
                      '&& tool == \'issue_refund\' && args.order_id in [\'A-1\', \'B-2\']"\n'
                      'policy = "auto"\n'
                      '[groups]\nS_FINANCE = ["U_BOB", "U_CAROL"]\n')
    Registry(demo_agents(), policy=load_policy_file(path)).check_policy()


def test_an_mcp_gateways_reads_are_let_through_unless_an_entry_names_them(
        tmp_path: Path) -> None:
    """``mcp:NAME/resource:URI`` and ``mcp:NAME/prompt:NAME``: read at once when no entry
    names them; an entry that does is theirs, as for a call (its policy, its rules on
    ``args.uri``, else ``[default]``'s: ask). A tool of the gateway still asks."""
    from approvald.runtime.policies.directory import StaticDirectory
    from approvald.runtime.policies.intake import Intake, Source

    path = tmp_path / "policy.toml"
    path.write_text('''
[tools."mcp:files/resource:file:///srv/*"]
approvers = ["U_ALICE"]

[tools."mcp:files/resource:*"]
policy = "auto"
[[tools."mcp:files/resource:*".rules]]
when = "args.uri.startsWith('file:///etc/')"
policy = "forbidden"
reason = "Nothing reads under /etc."
''')
    policy = load_policy_file(path)
    intake = Intake(lambda: policy, StaticDirectory({}))
    files, other = Source("mcp", "files"), Source("mcp", "tickets")

    def kind(source: Source, tool: str, args: dict[str, str]) -> str:
        return intake.resolve(source, tool, args).kind

    assert kind(other, "resource:file:///etc/passwd", {"uri": "file:///etc/passwd"}) == "auto"
    assert kind(other, "prompt:summary", {}) == "auto"
    assert kind(other, "read_file", {}) == "approve_before"  # a tool: [default] asks
    assert kind(files, "resource:file:///srv/a", {"uri": "file:///srv/a"}) == "approve_before"
    refused = intake.resolve(files, "resource:file:///etc/passwd", {"uri": "file:///etc/passwd"})
    assert (refused.kind, refused.reason) == ("forbidden", "Nothing reads under /etc.")
    assert kind(files, "resource:file:///tmp/x", {"uri": "file:///tmp/x"}) == "auto"


def test_a_copy_of_a_policy_file_answers_from_its_own_entries(tmp_path: Path) -> None:
    """What a file's reads worked out (entries, applied policies, its digest, its shadows)
    is its own: a copy with other entries (a policy tried out, ``runtime.insights``)
    answers from those, and the original still from its own."""
    path = tmp_path / "policy.toml"
    path.write_text('[tools."api:ci/deploy"]\npolicy = "auto"\n')
    policy = load_policy_file(path)
    kind, base = policy.default_policy()
    assert policy.for_call("api:ci/deploy", kind, base, {}).kind == "auto"
    digest = policy.digest
    tools = {"api:ci/deploy": policy.tools["api:ci/deploy"].model_copy(
        update={"policy": "forbidden", "mode": "shadow"})}
    copy = policy.model_copy(update={"tools": tools})
    assert copy.for_call("api:ci/deploy", kind, base, {}).kind == "approve_before"
    assert copy.has_shadows and not policy.has_shadows
    assert copy.digest != digest
    assert policy.for_call("api:ci/deploy", kind, base, {}).kind == "auto"
    assert policy.digest == digest
