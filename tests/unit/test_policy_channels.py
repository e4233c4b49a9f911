"""Where a policy in force names the email channel (what serve refuses to start with when
it cannot send mail): the file's tool entries, their rules, entries for other sources'
tools, ``[default]``, and an agent's own code."""

from __future__ import annotations

from pathlib import Path

import pytest
from approvald.runtime.models import ScriptedModel
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile, load_policy_file
from approvald.runtime.policies.tools import ToolContext, tool
from approvald.runtime.runs.agent import Agent, Registry
from approvald.runtime.runs.demo import demo_agents


def registry(tmp_path: Path, text: str) -> Registry:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return Registry(demo_agents(str(tmp_path / "ledger.jsonl")),
                    policy=load_policy_file(path))


@pytest.mark.parametrize(("text", "where"), [
    ("", None),
    ('[tools.issue_refund]\nchannels = ["slack"]\n', None),
    ('[tools.issue_refund]\nchannels = ["slack", "email"]\n', "tools.issue_refund"),
    ('[[tools.issue_refund.rules]]\nwhen = "args.amount_cents > 100"\n'
     'channels = ["slack", "email"]\n', "tools.issue_refund.rules[0]"),
    ('[tools."api:*/deploy"]\nchannels = ["slack", "email"]\n', 'tools.api:*/deploy'),
    ('[default]\nchannels = ["slack", "email"]\n', "default"),
])
def test_the_place_of_the_file_that_names_email_is_found(tmp_path: Path, text: str,
                                                         where: str | None) -> None:
    found = registry(tmp_path, text).naming_channel("email")
    assert found == (None if where is None else f"{where} in {tmp_path / 'policy.toml'}")


def test_an_agents_own_tool_naming_email_is_found() -> None:
    @tool(permission="execute", approval=ApprovalPolicy(channels=["slack", "email"]))
    async def wire(ctx: ToolContext, amount_cents: int) -> dict[str, int]:
        """Wire money."""
        return {"amount_cents": amount_cents}

    agent = Agent(name="wirer", instructions="", model=ScriptedModel.sequence([]),
                  tools=[wire])
    assert Registry([agent], policy=PolicyFile()).naming_channel("email") == "tool wire"
    assert Registry([agent], policy=PolicyFile()).naming_channel("slack") == "default"
