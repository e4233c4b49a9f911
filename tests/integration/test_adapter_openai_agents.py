"""OpenAI Agents SDK adapter end to end: a real Agent on the SDK's own ScriptedModel (no
network, tracing off) pauses on a needs_approval tool, its RunState is kept in approvald,
the requests are decided in Slack (signed clicks through the emulator against an
in-process serve), the run resumes with approve/reject (an edit runs the edited
arguments), and the refund happens once, even when the resume is repeated.

The SDK comes with the dev extra: missing, this module fails to import (no skip).

The tests are in ``adapter_openai_agents_case.py``, imported by each test here rather than at
collection: the framework's SDK costs seconds to import, and a pytest-xdist worker that
runs none of these tests no longer pays for it (issue 47 item 6); and they run on one worker (an
``xdist_group``, --dist loadgroup), which imports it once, not each worker that drew one
of them: one group for the three frameworks' tests and the facade's check that each
adapter's name resolves (``tests/unit/test_layers.py``), which imports all three."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("adapters")


async def test_approve_deny_and_edit_in_slack_resume_the_run_once(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_openai_agents_case as case

    await case.test_approve_deny_and_edit_in_slack_resume_the_run_once(
        db_url, tmp_path)


async def test_an_interruption_the_adapter_cannot_serve_is_refused(
        db_url: str, tmp_path: Path) -> None:
    from tests.integration import adapter_openai_agents_case as case

    await case.test_an_interruption_the_adapter_cannot_serve_is_refused(
        db_url, tmp_path)
