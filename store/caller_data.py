"""Which columns hold what callers send: sealing by schema, not by column (issue 46).

Every text column of the schema is named here, once, with what it holds:

* :data:`SEALED`: a call's arguments, its results, a run's task, a request's decision
  packet, an error (which may quote any of them), or anything that carries them (an
  outbox payload, a paused framework's state). These columns are
  :class:`~approvald.store.types.SealedText`, which reads this registry: with a data key
  each value is sealed at rest (``runtime/record/sealing.py``), and ``keys reseal`` finds them in
  the schema.
* :data:`MASKED`: written masked (the runtime masks what it records there), in clear so
  that it is read without the data key; values sealed there by older versions still open.
* :data:`CLEAR`: text that holds no caller data, with the reason.

A test (``tests/unit/test_caller_data.py``) walks the models: a text column (``Text``, or
a ``String`` longer than :data:`SHORT`) that is named in none of them fails it, and so
does a registered column that is no longer in the schema. So a new table cannot keep a
caller's arguments in clear by being forgotten: it is sealed, or someone wrote down here
why it need not be.
"""

from __future__ import annotations

from collections.abc import Mapping

# a String column at most this long holds an identifier, a name, a status or a digest
# (an e-mail address is 320): not checked
SHORT = 320

SEALED: Mapping[str, str] = {
    "runs.task": "the task a run was asked to do (an external request's: the caller's text)",
    "runs.result": "a run's final answer, or an external request's reported result",
    "runs.error": "why a run failed (an error may quote a call's arguments)",
    "runs.inflight": "the model reply of the step in progress: its calls' arguments",
    "runs.wait_reason": "why a run waits, which after an error quotes the error",
    "run_events.body": "the transcript: the task, calls' arguments and their results",
    "tool_executions.result": "what a call returned",
    "tool_executions.error": "why a call failed (it may quote the call's arguments)",
    "approvals.args": "the exact arguments a request asks about",
    "approvals.edited_args": "an approver's edit of them",
    "approvals.packet": "the decision packet: the task, the agent's words, evidence, impact",
    "approvals.reason": "a decider's reason, or the error a request was cancelled with",
    "outbox.payload": "a notice, a webhook or a mail: it may quote a call's arguments",
    "outbox.last_error": "why a delivery failed (an error may quote what was delivered)",
    "external_requests.args": "the exact arguments a caller asked about",
    "standing_approvals.scope": "the values a standing approval covers",
    "adapter_pauses.state": "a paused framework's state (its messages, its calls)",
    "adapter_pauses.requests": "a paused framework's calls (their arguments) and its task",
    "adapter_pauses.outcome": "what a resumed framework run came to",
}

MASKED: Mapping[str, str] = {
    "audit_log.details": "the audit log: recorded masked (runtime/record/audit.py), so that the "
                         "chain verifies and exports without the data key",
    "audit_requests.state": "a request folded from its audit entries (0024): the entries' "
                            "masked values only, never the arguments opened with the data key",
}

CLEAR: Mapping[str, str] = {
    "runs.cancel_reason": "the words of the person who cancelled the run",
    "approvals.approvers": "user and group ids, from the operator's policy",
    "approvals.policy": "the operator's policy for the request (a snapshot)",
    "outbox.result": "what a delivery returned: a channel and a message ts, a status",
    "api_tokens.webhook_url": "where the operator said a token's decisions are posted",
    "api_tokens.tools": "the tool names or globs the operator let a token ask about",
    "external_requests.reason": "why the operator's policy forbids the call",
    "external_requests.webhook_url": "where the caller's decisions are posted",
    "external_requests.sensitive": "argument paths (names), from the operator's policy",
    "tool_executions.sensitive": "argument paths (names), from the policy and the tool",
    "standing_approvals.rule": "the label of the operator's policy rule",
    "standing_approvals.approvers": "user and group ids, from the operator's policy",
    "standing_approvals.grants": "the ids of the users who granted it",
    "policy_in_force.source": "where the operator's policy file was loaded from",
    "face_switches.reason": "the operator's words on switching a face off (hook disable)",
    # widened to Text by 0021 (an MCP resource's URI is its tool name); names, not values:
    # the operator's policy matches them and the indexes find requests by them
    "approvals.tool": "the tool's name (an MCP resource's URI), matched by the policy",
    "tool_executions.tool": "the tool's name (an MCP resource's URI), matched by the policy",
    "external_requests.tool": "the tool's name a caller named, matched by the policy",
    "external_requests.policy_name": "the name the operator's policy resolved it under",
    "standing_approvals.tool": "the tool's name it covers, indexed to find it",
    "standing_approvals.subject": "the source and tool it covers (agent:NAME/TOOL), indexed",
}


def holds(column: str) -> str:
    """How ``column`` (``table.column``) is kept: ``sealed``, ``masked`` or ``clear``; a
    LookupError when it is not registered."""
    for kind, names in (("sealed", SEALED), ("masked", MASKED), ("clear", CLEAR)):
        if column in names:
            return kind
    raise LookupError(f"{column} is not registered in store/caller_data.py: say whether it "
                      "holds caller data (sealed) or not (clear, and why)")
