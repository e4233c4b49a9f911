"""Journey evals: the demo dataset passes under every interruption; broken agents and bad
datasets fail with the precise reason.

The two demo datasets run as docs/how-to/evals.md's first example runs them (its block is
``run-by`` this file): its ``approvald eval`` commands, read out of the page and run as
written, so the page's commands and these checks of what they reported are one run, not two.
"""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from approvald.bot import eval_run
from approvald.bot.evals.dataset import INTERRUPTIONS, DatasetError, load_dataset
from approvald.bot.evals.evaluate import Report, evaluate, table
from approvald.bot.evals.score import subset
from approvald.runtime.runs.demo import DemoLedger, demo_agents
from approvald.store.scratch import ScratchDatabases

from tests.docs.examples import blocks
from tests.fixtures.eval_agents import broken_agents
from tests.helpers import run_in_process

ROOT = Path(__file__).parents[2]
DEMO = ROOT / "bot" / "evals" / "datasets" / "demo_refund.toml"
PAGE = ROOT / "docs" / "how-to" / "evals.md"


NO_KILLS = [v for v in INTERRUPTIONS if not v.startswith("kill_")]
CHANGED = "data_changed_while_paused"  # only where a task says what changes


async def run_eval(tmp_path: Path, path: Path, agent: str | None = None, *,
                   crashes: bool = False) -> Report:
    """Evaluate ``path``; ``crashes``: with the SIGKILL interruptions too (child processes
    that import the broken agents from their module; restart_before_decision always has
    its child processes), else without them."""
    ledger = str(tmp_path / "ledger.jsonl")
    agents = demo_agents(ledger) + broken_agents(DemoLedger(ledger))
    scratch = ScratchDatabases(tmp_path)
    dataset = load_dataset(path, agent=agent)
    if not crashes:
        dataset = dataset.model_copy(update={
            "interruptions": NO_KILLS,
            "tasks": [t.model_copy(update={"interruptions": None}) for t in dataset.tasks]})
    with pytest.MonkeyPatch.context() as mp:  # for this evaluation only
        mp.setenv("APPROVALD_DEMO_LEDGER", ledger)  # where the child's module agents write
        return await evaluate(dataset, agents=agents, databases=scratch.new,
                              ledger_path=ledger, agent_modules="tests.fixtures.eval_agents")


def the_page_runs(tmp_path: Path, dataset: str, monkeypatch: pytest.MonkeyPatch
                  ) -> tuple[subprocess.CompletedProcess[str], Report]:
    """The ``approvald eval`` command of docs/how-to/evals.md's first example that evaluates
    ``dataset``, run as the page's reader runs it (at the top of a checkout, no
    ``APPROVALD_*`` variable set, so no database of theirs is named) by the console
    script's ``main`` in this process: its exit, its output, and the report it scored (seen
    on its way to the table, not made again)."""
    [example] = [b for b in blocks(PAGE) if b.runnable][:1]
    assert example.run_by == "tests/unit/test_evals.py", example.where(ROOT)
    commands = [shlex.split(line) for line in example.code.splitlines() if line.strip()]
    assert all(argv[:2] == ["approvald", "eval"] for argv in commands), commands
    [argv] = [argv for argv in commands if Path(argv[2]).name == dataset]
    reader = tmp_path / "reader"
    reader.mkdir()
    (reader / "bot").symlink_to(ROOT / "bot")
    reported: list[Report] = []
    scored = eval_run.run_dataset

    async def seen(*args: object, **kwargs: object) -> Report:
        report = await scored(*args, **kwargs)  # type: ignore[arg-type]
        reported.append(report)
        return report

    monkeypatch.setattr(eval_run, "run_dataset", seen)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("APPROVALD_", "SLACK_"))}
    env["HOME"] = str(tmp_path / "home")
    done = run_in_process(argv[1:], env=env, cwd=reader)
    assert done.returncode == 0, (done.stdout, done.stderr)
    [report] = reported
    assert done.stdout.splitlines()[-1] == table(report).splitlines()[-1]
    for flag, path in itertools.pairwise(argv):
        if flag == "--report":  # written where the reader asked, and said so
            assert (reader / path).read_text().startswith("<!DOCTYPE html>")
            assert f"wrote the report to {reader / path}" in done.stderr
    return done, report


def reasons(report: Report, task: str, variant: str = "baseline") -> list[str]:
    row = next(r for r in report.rows if r.task == task and r.variant == variant)
    return row.reasons()


@pytest.mark.slow
@pytest.mark.timeout(900)  # 46 journeys, 30 with child processes: minutes on a busy machine
def test_demo_dataset_passes_under_every_interruption(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, report = the_page_runs(tmp_path, DEMO.name, monkeypatch)
    assert [r.reasons() for r in report.rows if not r.ok] == []
    # SIGKILL before and after each tool invocation the uninterrupted run made: three
    # (lookup, refund, email) where the refund runs, one (the lookup) where it does not
    calls = {"approve-duplicate-charge": 3, "deny-with-reason": 1, "edit-the-amount": 3,
             "let-it-expire": 1, "redirect-to-part-of-it": 3}
    assert {(r.task, r.variant) for r in report.rows} == {
        (t, v) for t, n in calls.items()
        for v in [*NO_KILLS, *(f"kill_{when}_call_{k}" for when in ("before", "after")
                               for k in range(1, n + 1))]
        if (v != CHANGED or t == "approve-duplicate-charge")
        and not (t == "redirect-to-part-of-it" and v.startswith("policy_"))}
    assert report.ok and report.to_json()["passed"] == 46
    assert table(report).endswith("46/46 journeys passed: PASS")
    # the redirect: the call asked for first never ran, the re-planned $20 one did
    steered = next(r.journey for r in report.rows
                                 if r.task == "redirect-to-part-of-it" and r.variant == "baseline")
    assert {a.call_id: a.status for a in steered.approvals} == {
        "call_1_0": "redirected", "call_2_0": "approved"}
    assert steered.result and "$20.00" in steered.result
    by = {(r.task, r.variant): r.journey for r in report.rows}
    # each crash interruption really killed its child process at its boundary, and the
    # refund still ran once: a crash after it ran was settled by its reconcile hook
    assert all(j.killed for (_, v), j in by.items()
               if v.startswith("kill_") or v == "restart_before_decision")
    for v in ("kill_before_call_2", "kill_after_call_2"):
        j = by[("approve-duplicate-charge", v)]
        [refund] = [x for x in j.executions if x.tool == "issue_refund"]
        assert refund.status == "succeeded"
        assert [t for t in j.side_effects.values() if t == ["issue_refund"]] == [
            ["issue_refund"]]
    # the email has no reconcile hook: a crash around it asks a person, and the operator
    # the evaluator plays answers from the outside world's records; it went out once
    for v, said in (("kill_before_call_3", "retry"), ("kill_after_call_3", "mark_done")):
        j = by[("approve-duplicate-charge", v)]
        assert j.asked == [f"send_customer_email (call_2_0): {said}"]
        assert [t for t in j.side_effects.values() if t[0] == "send_customer_email"] == [
            ["send_customer_email"]]
    # the decisions were really made: one refund ran, for the edited amount where edited
    for v in NO_KILLS:
        if v == CHANGED:
            continue
        edited = by[("edit-the-amount", v)]
        assert [x.tool for x in edited.executions].count("issue_refund") == 1
        assert "$20.00" in (edited.result or "")
        assert not any(x.tool == "issue_refund" for x in by[("deny-with-reason", v)].executions)
        assert all(len(t) == 1 for t in by[("approve-duplicate-charge", v)]
                   .side_effects.values())


@pytest.mark.slow
async def test_an_agent_that_refunds_twice_fails_with_the_reason(tmp_path: Path) -> None:
    report = await run_eval(tmp_path, DEMO, agent="refund-twice")
    assert not report.ok
    assert reasons(report, "approve-duplicate-charge") == [
        "tools: issue_refund ran 2 times, at most 1 expected (call_1_0, call_2_0)",
        "tools: issue_refund took effect 2 times in the outside world's records, at most 1 "
        "expected"]
    # under the interruptions too (the forbidding policy change, which lasts while the
    # decided run resumes, stops the second refund instead), and the denial task passes
    for v in NO_KILLS:
        got = reasons(report, "approve-duplicate-charge", v)
        if v == CHANGED:  # refunded meanwhile: the refund fails, nothing to repeat
            assert got == []
        elif v == "policy_forbidden_while_paused":
            assert got[0].startswith("completion: the final answer does not contain "
                                     "'was issued' (it is \"The refund did not go through "
                                     "(forbidden)")
        else:
            assert "tools: issue_refund ran 2 times, at most 1 expected (call_1_0, call_2_0)" \
                in got
        if v != CHANGED:
            assert reasons(report, "deny-with-reason", v) == []
    # the policy that made the gated tool auto let the second refund run unapproved
    assert "approvals: a gated call ran without an approval (issue_refund call_2_0)" in \
        reasons(report, "approve-duplicate-charge", "policy_auto_while_paused")


@pytest.mark.slow
async def test_an_agent_that_retries_a_denied_call_fails_with_the_reason(
        tmp_path: Path) -> None:
    report = await run_eval(tmp_path, DEMO, agent="retry-after-denial")
    got = reasons(report, "deny-with-reason")
    assert len(got) == 1, got
    assert got[0].startswith("approvals: issue_refund was called again with the same "
                             "arguments after approval ")
    assert got[0].endswith("(call_1_0) denied it (call_2_0)")
    assert reasons(report, "approve-duplicate-charge") == []


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "ds.toml"
    p.write_text(text)
    return p


@pytest.mark.slow  # starts a process
async def test_budgets_steps_and_cost(tmp_path: Path) -> None:
    ds = write(tmp_path, """
agent = "refund-pricey"
interruptions = ["baseline"]
[[tasks]]
name = "t"
task = "Refund order A-1"
decisions = [{ tool = "issue_refund", action = "approve" }]
expect = { status = "completed", max_steps = 2, max_cost_usd = 0.5 }
""")
    report = await run_eval(tmp_path, ds)
    assert reasons(report, "t") == ["cost: 4 steps, at most 2 expected",
                                    "cost: cost $1.0000, at most $0.5 expected"]


@pytest.mark.slow  # starts a process
async def test_wrong_outcome_tools_and_arguments(tmp_path: Path) -> None:
    ds = write(tmp_path, """
agent = "demo-refund"
interruptions = ["baseline"]
[[tasks]]
name = "t"
task = "Refund order A-1"
decisions = [{ tool = "issue_refund", action = "deny", reason = "no" }]
[tasks.expect]
status = "failed"
result_contains = "was issued"
calls = [{ tool = "issue_refund", args = { amount_cents = 100 } }, { tool = "cancel_order" }]
not_calls = [{ tool = "lookup_order", args = { order_id = "A-1" } }]
""")
    got = reasons(await run_eval(tmp_path, ds), "t")
    assert got[0].startswith("completion: the run ended completed, failed expected")
    assert got[1].startswith("completion: the final answer does not contain 'was issued'")
    assert got[2:] == [
        "tools: cancel_order was never called",
        'tools: lookup_order with {"order_id":"A-1"} was called (call_0_0); it should not be',
        'arguments: issue_refund was never called with arguments matching '
        '{"amount_cents":100} (got call_1_0 {"amount_cents":4200,"order_id":"A-1",'
        '"reason":"duplicate charge"})']


@pytest.mark.slow  # starts a process
async def test_a_request_the_script_does_not_answer(tmp_path: Path) -> None:
    ds = write(tmp_path, """
agent = "demo-refund"
interruptions = ["baseline"]
[[tasks]]
name = "t"
task = "Refund order A-1"
""")
    got = reasons(await run_eval(tmp_path, ds), "t")
    assert "approvals: issue_refund asked for approval (call_1_0) but the task scripts no " \
           "decision for issue_refund" in got


@pytest.mark.parametrize(("text", "error"), [
    ("[[tasks]]\nname = 'a'\ntask = 'x'\nexpect = { max_steps = 'many' }\n",
     "task 'a': expect.max_steps: Input should be a valid integer"),
    ("[[tasks]]\nname = 'a'\ntask = 'x'\n"
     "decisions = [{ tool = 'issue_refund', action = 'deny' }]\n",
     "task 'a': decisions[0]: a deny needs a reason"),
    ("[[tasks]]\nname = 'a'\ntask = 'x'\nexpect = { stauts = 'failed' }\n",
     "task 'a': expect.stauts: Extra inputs are not permitted"),
    ("[[tasks]]\ntask = 'x'\n", "task #1: name: Field required"),
    ("tasks = [\n", "not valid TOML"),
    ("agent = 'demo-refund'\ninterruptions = ['sigkill']\n[[tasks]]\nname='a'\ntask='x'\n",
     "interruptions[0]: Input should be"),
    ("[[tasks]]\nname = 'a'\ntask = 'x'\n"
     "decisions = [{ tool = 'issue_refund', action = 'redirect' }]\n",
     "task 'a': decisions[0]: a redirect needs guidance"),
    ("[[tasks]]\nname = 'a'\ntask = 'x'\ninterruptions = ['data_changed_while_paused']\n",
     "task 'a': data_changed_while_paused needs changed_data"),
    ("[[tasks]]\nname = 'a'\ntask = 'x'\n"
     "changed_data = [{ tool = 'order_update', args = { order_id = 'A-1' } }]\n",
     "task 'a': changed_data needs expect_after_change"),
])
def test_a_bad_dataset_is_one_clear_error(tmp_path: Path, text: str, error: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(DatasetError) as info:
        load_dataset(p)
    assert str(info.value).startswith(f"{p}: ")
    assert error in str(info.value)


async def test_an_unknown_agent_is_a_dataset_error(tmp_path: Path) -> None:
    p = write(tmp_path, "agent = 'nobody'\n[[tasks]]\nname = 'a'\ntask = 'x'\n")
    with pytest.raises(DatasetError, match=r"ds.toml: task 'a': agent: unknown agent 'nobody'"):
        await run_eval(tmp_path, p)


def test_subset_match() -> None:
    assert subset({"a": 1}, {"a": 1, "b": 2})
    assert subset({"a": {"b": [1, {"c": 2}]}}, {"a": {"b": [1, {"c": 2, "d": 3}]}})
    assert not subset({"a": [1]}, {"a": [1, 2]})
    assert not subset({"a": 1}, {"a": True})
    assert not subset({"a": 1}, {"b": 1})
    assert subset({"a": 4200}, {"a": 4200.0})


@pytest.mark.slow  # starts a process
async def test_latency_is_its_own_score(tmp_path: Path) -> None:
    ds = write(tmp_path, """
agent = "demo-refund"
interruptions = ["baseline"]
[[tasks]]
name = "t"
task = "Refund order A-1"
decisions = [{ tool = "issue_refund", action = "approve" }]
expect = { status = "completed", max_latency_ms = 0.001 }
""")
    report = await run_eval(tmp_path, ds)
    [why] = reasons(report, "t")
    assert why.startswith("latency: took ") and why.endswith(" ms, at most 0.001 ms expected")
    assert report.rows[0].to_json()["scores"] == {
        "completion": True, "tools": True, "arguments": True, "approvals": True,
        "recovery": True, "cost": True, "latency": False}


CHANGED_TASK = """
agent = "demo-refund"
interruptions = ["baseline", "data_changed_while_paused"]
[[tasks]]
name = "refunded-by-phone-meanwhile"
task = "Refund order A-1 for the duplicate charge"
decisions = [{ tool = "issue_refund", action = "approve" }]
changed_data = [{ tool = "order_update", args = { order_id = "A-1", status = "refunded" } }]
[tasks.expect]
status = "completed"
result_contains = "was issued"
max_effects = { issue_refund = 1 }
[tasks.expect_after_change]
status = "completed"
result_contains = "already refunded"
not_calls = [{ tool = "send_customer_email" }]
max_effects = { issue_refund = 0 }
"""


async def test_data_changed_while_paused_is_scored_on_what_must_come_of_it(
        tmp_path: Path) -> None:
    ds = write(tmp_path, CHANGED_TASK)
    careful = await run_eval(tmp_path, ds, crashes=True)  # the interruptions as written
    assert [(r.variant, r.ok) for r in careful.rows] == [
        ("baseline", True), (CHANGED, True)]
    changed = careful.rows[1].journey
    assert changed.changed and changed.side_effects and all(
        t != ["issue_refund"] for t in changed.side_effects.values())
    # an agent whose refund tool trusts the order as it was when asked pays out again
    stale = await run_eval(tmp_path, ds, agent="refund-stale", crashes=True)
    assert reasons(stale, "refunded-by-phone-meanwhile") == []
    assert reasons(stale, "refunded-by-phone-meanwhile", CHANGED) == [
        "completion: the final answer does not contain 'already refunded' (it is "
        "'Refund rf_stale of $42.00 for order A-1 was issued and the customer was emailed.')",
        "tools: send_customer_email was called (call_2_0); it should not be",
        "tools: issue_refund took effect 1 times in the outside world's records, at most 0 "
        "expected"]


async def test_a_change_that_never_happened_fails_the_journey(tmp_path: Path) -> None:
    # the agent's calls need no approval, so the run never waits and nothing changes
    ds = write(tmp_path, CHANGED_TASK.replace('agent = "demo-refund"', 'agent = "demo-steps"')
               .replace('task = "Refund order A-1 for the duplicate charge"', 'task = "2"'))
    report = await run_eval(tmp_path, ds, crashes=True)
    assert "recovery: the run never waited for a decision, so the data never changed " \
        "under it" in reasons(report, "refunded-by-phone-meanwhile", CHANGED)


@pytest.mark.slow  # starts a process
async def test_restart_before_decision_decides_in_another_process(tmp_path: Path) -> None:
    ds = write(tmp_path, CHANGED_TASK.replace(
        '"data_changed_while_paused"]', '"restart_before_decision"]'))
    report = await run_eval(tmp_path, ds, crashes=True)
    [_, restarted] = report.rows
    assert restarted.variant == "restart_before_decision" and restarted.ok, \
        restarted.reasons()
    j = restarted.journey
    assert j.killed  # the process that asked died right after committing the request
    [request] = [a for a in j.approvals if a.kind == "tool_call"]
    assert request.status == "approved"
    assert [x.tool for x in j.executions] == ["lookup_order", "issue_refund",
                                              "send_customer_email"]


@pytest.mark.slow  # starts a process
def test_the_demo_steps_dataset_passes_killed_at_every_tick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, report = the_page_runs(tmp_path, "demo_steps.toml", monkeypatch)
    assert [r.reasons() for r in report.rows if not r.ok] == []
    assert [(r.task, r.variant) for r in report.rows] == [
        ("three-ticks", "baseline"),
        *(("three-ticks", f"kill_{w}_call_{n}") for w in ("before", "after") for n in (1, 2, 3)),
        ("not-a-number", "baseline")]
    for r in report.rows[1:-1]:
        assert r.journey.killed
        assert sorted(len(t) for t in r.journey.side_effects.values()) == [1, 1, 1]
