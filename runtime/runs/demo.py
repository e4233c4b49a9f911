"""Built-in demo agents, driven by :class:`ScriptedModel`, for the README, tests and benchmarks.

``demo-refund`` looks up the order its task names ("Refund order A-1": A-1; an order it does not
hold, or a task that names none, ends the run saying so, with nothing asked), asks to refund
the amount the task names ("$25.00"; else the order's duplicate charge) (``approve_before``),
then emails the customer (``notify_after``); a denial or an expiry ends the run with a
message saying so. A redirect is followed: guidance that names an amount ("refund only
$20") becomes a new refund request for that amount (which needs approval again); other
guidance ends the run quoting it, with no refund.
``demo-steps`` calls ``tick(i)`` N times. Every demo tool appends one JSON line per real
invocation to ``APPROVALD_DEMO_LEDGER`` (when set), so side effects can be counted
independently of the runtime's own bookkeeping.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timedelta
from typing import Any

from approvald.runtime.models.base import ModelReply, Transcript
from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
from approvald.runtime.policies.policy import ApprovalPolicy
from approvald.runtime.policies.tools import Reconciled, ToolContext, tool
from approvald.runtime.record.state import ToolMessage
from approvald.runtime.runs.agent import Agent


class DemoLedger:
    """An append-only JSON-lines file standing in for the outside world's records."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def record(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> None:
        if not self.path:
            return
        self.append(name, args, key=ctx.idempotency_key, at=ctx.clock.now())

    def append(self, name: str, args: dict[str, Any], *, key: str, at: datetime,
               scope: str | None = None) -> None:
        """Record an invocation (a tool's, or something done outside any run; ``scope``:
        seen by that run alone)."""
        if not self.path:
            return
        entry = {"tool": name, "args": args, "idempotency_key": key, "at": at.isoformat()}
        if scope is not None:
            entry["scope"] = scope
        line = json.dumps(entry, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write: a line is there whole or not at all
        finally:
            os.close(fd)

    def order_update(self, order_id: str, run_id: str) -> dict[str, Any] | None:
        """The latest ``order_update`` the outside world recorded for ``order_id`` (what
        someone else did to the order, e.g. refunded it by phone), if any. An update
        scoped to one run (an eval journey's change: one ledger serves all the journeys
        of an evaluation) is seen by that run alone."""
        latest: dict[str, Any] | None = None
        for entry in self._entries():
            args = entry.get("args")
            if entry.get("tool") == "order_update" and isinstance(args, dict) \
                    and args.get("order_id") == order_id \
                    and entry.get("scope", run_id) == run_id:
                latest = args
        return latest

    def _entries(self) -> list[dict[str, Any]]:
        if not self.path or not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    def find(self, key: str) -> dict[str, Any] | None:
        """The recorded invocation under ``key``, if the outside world has seen it."""
        return next((e for e in self._entries() if e.get("idempotency_key") == key), None)


# -- demo-refund --------------------------------------------------------------------------

_ORDER = re.compile(r"\b([A-Z]{1,3}-\d{1,8})\b")
# an order named in some other form ("order 7007", "order #7007"): named, but not one the
# demo's store holds, so the lookup says it was not found
_NAMED = re.compile(r"\border\s+#?([A-Za-z_]*\d[\w-]{0,31})", re.IGNORECASE)
# "$25", "$1,250.50", "25.00 USD": an amount the task names is the amount to refund
_AMOUNT = re.compile(r"\$\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?!\d)"
                     r"|\b(\d+)(?:\.(\d{1,2}))?\s?USD\b")


def task_amount(task: str) -> int | None:
    """The amount in cents that ``task`` names ("$25.00", "25 USD"), if it names one."""
    found = _AMOUNT.search(task)
    if found is None:
        return None
    whole, frac = (found.group(1), found.group(2)) if found.group(1) else (found.group(3),
                                                                          found.group(4))
    cents = int(whole.replace(",", "")) * 100 + int((frac or "0").ljust(2, "0"))
    return cents or None


def task_order(task: str) -> str | None:
    """The order ``task`` names: a demo order id ("A-1", "B-1042"), else whatever follows
    the word "order" ("order 7007": 7007, which the demo's store does not hold), else
    None. Never an order the task did not name."""
    found = _ORDER.search(task) or _NAMED.search(task)
    return found.group(1) if found else None


def demo_order(order_id: str) -> bool:
    """Does the demo's store hold ``order_id``? Its orders are ids like A-1001."""
    return _ORDER.fullmatch(order_id) is not None


def _cents(value: int) -> str:
    return f"${value / 100:,.2f}"


def _last_result(messages: Transcript) -> ToolMessage | None:
    for m in reversed(messages):
        if isinstance(m, ToolMessage):
            return m
    return None


def _unwrap(content: Any) -> Any:
    if isinstance(content, dict) and content.get("status") == "executed_with_edits":
        return content.get("result")
    return content


def refund_script(messages: Transcript) -> ModelReply:
    """What a careful support agent would do, as a pure function of the transcript."""
    turn = assistant_turns(messages)
    task = messages[0].content if messages and isinstance(messages[0].content, str) else ""
    order_id = task_order(task)
    if order_id is None:
        return reply("The task names no order (the demo's orders look like A-1001), so I "
                     "looked nothing up and issued no refund.", turn=turn)
    last = _last_result(messages)
    if last is None:
        return reply("I'll look the order up first.", ("lookup_order", {"order_id": order_id}),
                     turn=turn)
    content = _unwrap(last.content)
    status = content.get("status") if isinstance(content, dict) else None
    if last.name == "lookup_order":
        if status is not None or not isinstance(content, dict) \
                or "duplicate_charge_cents" not in content:
            return reply(f"I could not look order {order_id} up ({status or 'no data'}), so I "
                         "issued no refund.", turn=turn)
        if content.get("order_status") in ("refunded", "closed"):
            return reply(f"Order {order_id} is already {content['order_status']}, so I issued "
                         "no refund.", turn=turn)
        asked = task_amount(task)
        amount = asked if asked is not None else int(content["duplicate_charge_cents"])
        what = ("the amount asked for" if asked is not None
                else "the duplicate charge")
        return reply(
            f"Order {order_id} was charged twice; I will refund {what}: {_cents(amount)}.",
            ("issue_refund", {"order_id": order_id, "amount_cents": amount,
                              "reason": "duplicate charge"}),
            turn=turn)
    if last.name == "issue_refund":
        if status == "denied":
            return reply("I did not issue the refund: the approver denied it, saying "
                         f"{_quoted(content.get('reason'))}", turn=turn)
        if status == "redirected":
            return _follow_redirect(content, order_id, turn)
        if status == "expired":
            return reply("The refund request expired without a decision, so no refund was "
                         "issued.", turn=turn)
        if status in ("error", "cancelled", "forbidden", "invalid_arguments", "not_executed"):
            return reply(f"The refund did not go through ({status}): "
                         f"{content.get('error') or content.get('reason') or ''}".rstrip(": "),
                         turn=turn)
        return reply(
            "The refund is issued; I'll let the customer know.",
            ("send_customer_email", {
                "order_id": order_id,
                "subject": f"Your refund for order {order_id}",
                "body": f"We refunded {_cents(int(content['amount_cents']))} "
                        f"(refund {content['refund_id']}).",
            }),
            turn=turn)
    # the refund that ran (after a redirect, earlier requests for it did not)
    refund: dict[str, Any] = next((r for r in (_unwrap(m.content) for m in reversed(messages)
                                               if isinstance(m, ToolMessage)
                                               and m.name == "issue_refund")
                                   if isinstance(r, dict) and "refund_id" in r), {})
    return reply(
        f"Refund {refund.get('refund_id')} of {_cents(int(refund.get('amount_cents', 0)))} for "
        f"order {order_id} was issued and the customer was emailed.", turn=turn)


def _quoted(said: Any) -> str:
    """A person's words in quotes ending the sentence once: ``"No."`` and not ``"No."."``.
    (The approver is not named: a user id is no name, and the thread and the card say
    who decided, as Slack shows people.)"""
    text = str(said or "").strip()
    return f'"{text}"' if text[-1:] in (".", "!", "?", "…") else f'"{text}".'


def _follow_redirect(content: dict[str, Any], order_id: str, turn: int) -> ModelReply:
    """Re-plan on an approver's guidance: a refund of the amount it names, asked for
    anew; else no refund, saying why."""
    guidance = str(content.get("guidance") or "")
    amount = task_amount(guidance)
    if amount is None:
        return reply("I did not issue the refund: the approver redirected it, saying "
                     f"{_quoted(guidance)}", turn=turn)
    return reply(
        f"The approver asked me to change the plan (\"{guidance}\"), so I will refund "
        f"{_cents(amount)} for order {order_id} instead.",
        ("issue_refund", {"order_id": order_id, "amount_cents": amount,
                          "reason": "duplicate charge"}),
        turn=turn)


REFUND_POLICY = ApprovalPolicy(
    approvers=[], quorum=1, ttl=timedelta(minutes=30), reminders=[0.5, 0.9],
    on_expire="cancel", risk="high",
    why="Refunds move money back to a customer's card and cannot be undone.",
)


def refund_agent(ledger: DemoLedger, *, approval: ApprovalPolicy = REFUND_POLICY) -> Agent:
    @tool(permission="read")
    async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
        """Look an order up: its customer, what was charged, and any duplicate charge."""
        ledger.record(ctx, "lookup_order", {"order_id": order_id})
        if not demo_order(order_id):
            return {"order_id": order_id, "status": "not_found"}
        found: dict[str, Any] = {
            "order_id": order_id, "customer_email": "dana@example.com",
            "charged_cents": 8400, "duplicate_charge_cents": 4200, "currency": "USD"}
        update = ledger.order_update(order_id, ctx.run_id)
        if update is not None:
            found["order_status"] = update.get("status")
        return found

    async def refund_reconcile(ctx: ToolContext, args: dict[str, Any]) -> Reconciled | None:
        # the payment provider deduplicates by idempotency key; ask it what it saw
        seen = ledger.find(ctx.idempotency_key)
        if seen is None:
            return Reconciled(happened=False)
        return Reconciled(happened=True, result=_refund_result(ctx, args))

    @tool(permission="execute", policy="approve_before", approval=approval,
          reconcile=refund_reconcile,
          impact=lambda a: f"{_cents(int(a['amount_cents']))} goes back to the customer's card "
                           f"for order {a['order_id']}.")
    async def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int,
                           reason: str) -> dict[str, Any]:
        """Refund part or all of an order's charge to the customer's card."""
        if amount_cents <= 0:
            raise ValueError("amount_cents must be positive")
        # the provider's view of the order now, not when the refund was asked for: someone
        # may have refunded it another way while this call waited for its approval
        update = ledger.order_update(order_id, ctx.run_id)
        if update is not None and update.get("status") in ("refunded", "closed"):
            note = f" ({update['note']})" if update.get("note") else ""
            raise RuntimeError(f"order {order_id} is already {update['status']}{note}; "
                               "nothing was refunded")
        args = {"order_id": order_id, "amount_cents": amount_cents, "reason": reason}
        ledger.record(ctx, "issue_refund", args)
        return _refund_result(ctx, args)

    @tool(permission="execute", policy="notify_after")
    async def send_customer_email(ctx: ToolContext, order_id: str, subject: str,
                                  body: str) -> dict[str, Any]:
        """Email the customer about their order."""
        ledger.record(ctx, "send_customer_email",
                      {"order_id": order_id, "subject": subject, "body": body})
        return {"sent": True, "to": "dana@example.com"}

    return Agent(
        name="demo-refund",
        instructions="You are a support agent. Verify an order before refunding it; refunds "
                     "need human approval. Tell the customer when money moves.",
        model=ScriptedModel(refund_script),
        tools=[lookup_order, issue_refund, send_customer_email],
    )


def _refund_result(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    digest = hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()
    return {"refund_id": "rf_" + digest[:12],
            "order_id": args["order_id"], "amount_cents": args["amount_cents"],
            "status": "issued"}


# -- demo-steps ---------------------------------------------------------------------------

def steps_script(messages: Transcript) -> ModelReply:
    # the turn number is read off the last tick's result, so a step costs the same at
    # tick 10 and tick 10,000 (the benchmark measures the runtime, not this script)
    last = messages[-1] if messages else None
    turn = (last.content["i"] + 1 if isinstance(last, ToolMessage) and last.name == "tick"
            and isinstance(last.content, dict) and "i" in last.content
            else assistant_turns(messages))
    task = messages[0].content if messages else "0"
    try:
        n = int(str(task).strip().split()[0])
    except (ValueError, IndexError):
        return reply(f"The task must be a number of ticks, got {task!r}.", turn=turn)
    if turn < n:
        return reply(None, ("tick", {"i": turn}), turn=turn)
    return reply(f"Ticked {n} times.", turn=turn)


def steps_agent(ledger: DemoLedger, *, payload_bytes: int = 0, name: str = "demo-steps",
                idempotent: bool = False) -> Agent:
    """Ticks N times. ``idempotent``: each tick is a read that may run twice (no intent
    row; its result rides in the step's checkpoint), for the checkpoint benchmark."""
    pad = "x" * payload_bytes

    async def tick_reconcile(ctx: ToolContext, args: dict[str, Any]) -> Reconciled | None:
        seen = ledger.find(ctx.idempotency_key)
        if seen is None:
            return Reconciled(happened=False)
        return Reconciled(happened=True, result={"i": args["i"], "pad": pad})

    # a read by name, but each tick is a side effect the crash tests count exactly once:
    # not idempotent (unless asked), so an interrupted tick is settled by its reconcile hook
    @tool(permission="read", idempotent=idempotent, reconcile=tick_reconcile)
    async def tick(ctx: ToolContext, i: int) -> dict[str, Any]:
        """Count one tick."""
        ledger.record(ctx, "tick", {"i": i})
        return {"i": i, "pad": pad}

    return Agent(name=name, instructions="Tick the number of times the task says.",
                 model=ScriptedModel(steps_script), tools=[tick], max_steps=1_000_000)


def demo_agents(ledger_path: str | None = None) -> list[Agent]:
    ledger = DemoLedger(ledger_path)
    return [refund_agent(ledger), steps_agent(ledger)]
