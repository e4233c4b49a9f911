"""Pydantic AI adapter end to end: a real Agent with a FunctionModel (Pydantic AI's own
test model) ends on DeferredToolRequests, the requests are decided in Slack (signed clicks
through the emulator against an in-process serve), the agent resumes from the message
history kept in approvald with DeferredToolResults, and the refund happens once, even
when the resume is repeated.

The framework comes with the dev extra: missing, this module fails to import (no skip).

The tests are in ``adapter_pydantic_ai_case.py``, imported by each test here rather than at
collection: the framework's SDK costs seconds to import, and a pytest-xdist worker that
runs none of these tests no longer pays for it (issue 47 item 6); and they run on one worker (an
``xdist_group``, --dist loadgroup), which imports it once, not each worker that drew one
of them: one group for the three frameworks' tests and the facade's check that each
adapter's name resolves (``tests/unit/test_layers.py``), which imports all three."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("adapters")


async def test_approve_deny_and_edit_in_slack_resume_the_agent_once(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_pydantic_ai_case as case

    await case.test_approve_deny_and_edit_in_slack_resume_the_agent_once(
        db_url, tmp_path)


async def test_a_call_cut_short_is_never_run_again_and_auto_runs_without_a_card(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_pydantic_ai_case as case

    await case.test_a_call_cut_short_is_never_run_again_and_auto_runs_without_a_card(
        db_url, tmp_path)


async def test_a_finished_outcome_names_the_same_pause_on_every_resume(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_pydantic_ai_case as case

    await case.test_a_finished_outcome_names_the_same_pause_on_every_resume(
        db_url, tmp_path)
