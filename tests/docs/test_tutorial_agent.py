"""The first-agent tutorial's scripted model answers every tool result the tutorial says a
model may receive (issue 48 item 5: after a deploy, *Re-plan* handed it
``{"status": "not_executed", …}``, which the page's list omitted and its script failed on
with ``KeyError: 'cents'``).

The statuses are read from the page's own list, so a status added there must be handled by
the script, and the script is the page's own ``myagents.py`` block."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.record.state import AssistantMessage, ToolCall, ToolMessage, UserMessage

from tests.docs.examples import blocks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorials" / "first-agent.md"
_LIST = re.compile(r"Tool results the model receives for calls that did not run:(.*?)\n\n",
                   re.S)


def documented_statuses() -> list[str]:
    found = _LIST.search(PAGE.read_text(encoding="utf-8"))
    assert found, "the page no longer lists the results of calls that did not run"
    return re.findall(r'\{"status": "([a-z_]+)"', found.group(1))


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Any:
    saved = [b for b in blocks(PAGE) if b.save_as == "myagents.py"]
    assert len(saved) == 1
    module = types.ModuleType("tutorial_myagents")
    here = tmp_path_factory.mktemp("tutorial")
    sys.modules[module.__name__] = module  # dataclasses and pydantic look their module up
    try:
        exec(compile(saved[0].code, str(here / "myagents.py"), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module.script


def transcript(result: dict[str, Any]) -> list[Any]:
    """Pay invoice INV-1042: looked up, asked to pay, and this came of the payment."""
    find = ToolCall(id="call_0_0", name="find_invoice", arguments={"number": "INV-1042"})
    pay = ToolCall(id="call_1_0", name="pay_invoice",
                   arguments={"number": "INV-1042", "cents": 12500})
    return [UserMessage(content="Pay invoice INV-1042"),
            AssistantMessage(content="I'll look the invoice up.", tool_calls=[find]),
            ToolMessage(call_id=find.id, name=find.name,
                        content={"number": "INV-1042", "cents": 12500}),
            AssistantMessage(content="It is due: paying INV-1042.", tool_calls=[pay]),
            ToolMessage(call_id=pay.id, name=pay.name, content=result)]


def test_the_page_lists_the_results_a_deploy_can_give() -> None:
    statuses = documented_statuses()
    assert "not_executed" in statuses and "denied" in statuses and "expired" in statuses


@pytest.mark.parametrize("status", documented_statuses())
def test_the_script_answers_each_documented_result_of_a_call_that_did_not_run(
        script: Any, status: str) -> None:
    result: dict[str, Any] = {"status": status, "reason": "the tool changed in a deploy",
                              "by": "U_ALICE", "guidance": "pay half", "errors": [],
                              "error_class": "ToolTimeout", "error": "timed out"}
    answer = script(transcript(result))
    assert not answer.tool_calls
    assert answer.content and "Paid" not in answer.content, answer.content


def test_the_script_reports_a_payment(script: Any) -> None:
    answer = script(transcript({"key": "k", "number": "INV-1042", "cents": 12500}))
    assert answer.content == "Paid 12500 cents."
