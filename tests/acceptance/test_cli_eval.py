"""`approvald eval` as a user (and CI) runs it: the table, --json, and the exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import make_cli

# processes, browsers or hundreds of schedules: out of the inner loop (-m 'not slow')
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
DEMO = str(ROOT / "bot" / "evals" / "datasets" / "demo_refund.toml")


def test_the_demo_dataset_passes_and_the_report_says_so(sqlite_url: str,
                                                         tmp_path: Path) -> None:
    """The CLI's table and --json, and exit 0, on one task of the demo dataset under each
    kind of interruption (the whole dataset, 46 journeys, runs in tests/unit/test_evals.py
    as the docs' how-to/evals.md example runs it: a second run here cost 80 s of CI)."""
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    one = tmp_path / "one.toml"
    first = Path(DEMO).read_text().split("[[tasks]]")[1]  # approve-duplicate-charge
    one.write_text('agent = "demo-refund"\ninterruptions = ["baseline", "duplicate_callback", '
                   '"restart_before_decision", "kill_before_calls", '
                   '"data_changed_while_paused"]\n\n[[tasks]]' + first)
    done = cli("eval", str(one), timeout=600)  # the kills and the restart: child processes
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "7/7 journeys passed: PASS"
    for variant in ("baseline", "duplicate_callback", "restart_before_decision",
                    "kill_before_call_1", "kill_before_call_2", "kill_before_call_3",
                    "data_changed_while_paused"):
        assert any(line.startswith(f"approve-duplicate-charge  {variant} ") and
                   line.endswith("PASS") for line in lines), variant
    # --json: SIGKILLed after each of its three tool calls
    one.write_text('agent = "demo-refund"\ninterruptions = ["baseline", "kill_after_calls"]'
                   "\n\n[[tasks]]" + first)
    report = json.loads(cli.ok("eval", str(one), "--json"))
    assert report["ok"] is True and report["passed"] == report["total"] == 4
    assert [j["interruption"] for j in report["journeys"]] == [
        "baseline", "kill_after_call_1", "kill_after_call_2", "kill_after_call_3"]
    # the journeys ran in scratch databases, not in the one APPROVALD_DATABASE_URL names
    assert cli.json("runs", "list", "--json") == []


def in_process(tmp_path: Path) -> str:
    """The demo dataset under the interruptions that need no child process."""
    text = re.sub(r"^interruptions = \[.*?\]\n", "", Path(DEMO).read_text(),
                  flags=re.S | re.M)
    quick = tmp_path / "quick.toml"
    quick.write_text('interruptions = ["baseline", "duplicate_callback", '
                     '"policy_auto_while_paused"]\n' + text)
    return str(quick)


def test_a_broken_agent_fails_the_eval_with_exit_1(sqlite_url: str, tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    cli.env_extra.update(APPROVALD_AGENTS="tests.fixtures.eval_agents", PYTHONPATH=str(ROOT))
    quick = in_process(tmp_path)  # the broken habits show without the crash journeys
    done = cli("eval", quick, "--agent", "refund-twice")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "    - tools: issue_refund ran 2 times, at most 1 expected (call_1_0, call_2_0)" \
        in done.stdout.splitlines()
    assert done.stdout.splitlines()[-1].endswith("journeys passed: FAIL")
    report = json.loads(cli("eval", quick, "--agent", "retry-after-denial", "--json").stdout)
    assert report["ok"] is False
    deny = next(j for j in report["journeys"]
                if j["task"] == "deny-with-reason" and j["interruption"] == "baseline")
    assert deny["scores"]["approvals"] is False
    assert "was called again with the same arguments" in deny["failures"]["approvals"][0]


def test_a_bad_dataset_is_one_line_and_exit_2(sqlite_url: str, tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    bad = tmp_path / "bad.toml"
    bad.write_text("agent = 'demo-refund'\n[[tasks]]\nname = 'a'\ntask = 'x'\n"
                   "decisions = [{ tool = 'issue_refund', action = 'maybe' }]\n")
    done = cli("eval", str(bad))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"approvald: {bad}: task 'a': decisions[0].action: Input should be 'approve', "
        "'deny', 'edit', 'redirect' or 'expire'"]
    missing = cli("eval", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "no such dataset file" in missing.stderr
