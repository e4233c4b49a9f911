"""LangGraph adapter end to end: a real graph with a SQLite checkpointer pauses in its tool
node on an interrupt, the request is decided in Slack (signed clicks through the emulator
against an in-process serve), the graph resumes from its checkpoint, and the refund
happens once, even when the resume is repeated.

The framework comes with the dev extra: missing, this module fails to import (no skip).

The tests are in ``adapter_langgraph_case.py``, imported by each test here rather than at
collection: the framework's SDK costs seconds to import, and a pytest-xdist worker that
runs none of these tests no longer pays for it (issue 47 item 6); and they run on one worker (an
``xdist_group``, --dist loadgroup), which imports it once, not each worker that drew one
of them: one group for the three frameworks' tests and the facade's check that each
adapter's name resolves (``tests/unit/test_layers.py``), which imports all three."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("adapters")


async def test_approve_deny_and_edit_in_slack_resume_the_graph_once(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_langgraph_case as case

    await case.test_approve_deny_and_edit_in_slack_resume_the_graph_once(
        db_url, tmp_path)


async def test_a_forged_resume_runs_nothing(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_langgraph_case as case

    await case.test_a_forged_resume_runs_nothing(
        db_url, tmp_path)


async def test_a_resume_naming_another_calls_approved_request_runs_nothing(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_langgraph_case as case

    await case.test_a_resume_naming_another_calls_approved_request_runs_nothing(
        db_url, tmp_path)
