"""Policy files: durations, percentages, ladders, and one clear error per bad key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from runtime.agent import Registry
from runtime.demo import demo_agents
from runtime.errors import ConfigError
from runtime.policy import ApprovalPolicy, format_duration, load_policy_file, parse_duration

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
     "tools.issue_refund.ttl: Value error, not a duration"),
    ("[tools.issue_refund]\ncolour = \"red\"\n", "tools.issue_refund.colour: Extra inputs"),
    ("[tools.issue_refund]\nreminders = [\"150%\"]\n", "tools.issue_refund.reminders"),
    ("[tools.issue_refund]\non_expire = \"approve\"\n", "tools.issue_refund.on_expire"),
    ("[tools.issue_refund]\non_expire = \"escalate\"\n", "needs an escalate ladder"),
    ("[tools.issue_refund]\napprovers = [\"U_A\"]\nquorum = 2\n", "quorum 2 needs more approvers"),
    ("[tools.no_such_tool]\nttl = \"1h\"\n", "no agent defines a tool named 'no_such_tool'"),
    ("[surprise]\nx = 1\n", "surprise: Extra inputs"),
    ("this is = = not toml", "not valid TOML"),
])
def test_bad_policy_files_are_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        Registry(demo_agents(), policy=load_policy_file(path)).check_policy()
    assert message in str(err.value)
    assert str(err.value).startswith("APPROVALD_POLICY_FILE: ")
    assert "\n" not in str(err.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy_file(tmp_path / "nope.toml")


def test_silence_cannot_be_configured_to_approve() -> None:
    with pytest.raises(ValueError):
        ApprovalPolicy.model_validate({"on_expire": "approve"})
