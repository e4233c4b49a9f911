"""Claude Code's ``PreToolUse`` / ``PostToolUse`` hook: the decision, served by the command
hook (``approvald hook claude-code``, :mod:`bot.hooks`) and by the HTTP hook (``POST
/v1/hooks/claude-code``, :mod:`bot.api`), so it lives in no face.

The contract, for Claude Code and any tool with the same shape. The hook reads one JSON
object on stdin: ``hook_event_name`` (``PreToolUse``, ``PostToolUse`` or
``PostToolUseFailure``), ``session_id``, ``cwd``, ``tool_name``, ``tool_input`` (an
object), ``tool_use_id``, and after the call ``tool_response`` (or ``error``). For
``PreToolUse`` it prints one JSON object and exits 0::

    {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                            "permissionDecision": "allow" | "deny",
                            "permissionDecisionReason": "...",
                            "updatedInput": {...}}}      # only when an approver edited it

For the events after the call it prints nothing and exits 0: what ran (the event's
``tool_input``, flagged where it is not what was approved), and what came of it, is
recorded as the call's execution (audit ``executed``).

Each call is an external request (:mod:`runtime.callers`) under approvald's own credential
``hook.claude-code``, named ``hook:claude-code/<tool_name>`` in the policy file (MCP tools
arrive as ``mcp__<server>__<tool>``), whose rules see ``args`` (the ``tool_input``). The
operator's ``auto`` allows at once (each call its own request, recorded), ``forbidden``
denies at once, anything else waits for a decision (its card goes to Slack through
``serve``'s outbox like every other request) up to the hook's budget. Still pending then:
deny, saying where it can be decided (as the database knows it) and audited; the same call
made again in the same session (same tool, same input: the join key) joins that request
instead of asking twice, and once it is decided, the call made next gets its answer, once
(:mod:`runtime.callers`).

An approval allows the call once. Allowing it records the call's start (the execution
ledger's intent row, owned by ``claude-code:<session>:<tool_use_id>``), so the request is
taken: the same call later asks again, unless a standing approval covers it. The
``PostToolUse`` of that tool use reports the result against it.

It fails closed: whatever stops it from deciding (no database, a malformed event, the hook
switched off: ``approvald hook disable claude-code``) is a deny whose reason says why,
never an allow.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from approvald.bot.claude_code_contract import (  # the wire contract, importable on its own
    DEFAULT_WAIT,
    EVENTS,
    HTTP_MARGIN,
    MARGIN,
    MAX_EVENT,
    MAX_HTTP_WAIT,
    NAME,
    POST,
    POST_FAILED,
    PRE,
    HookEvent,
    HookEventError,
    decision,
    fail_closed,
)
from approvald.runtime import (
    OPEN,
    CallerGate,
    CallerOff,
    Engine,
    ExternalError,
    NewRequest,
    PayloadTooLarge,
    Refused,
    Report,
    Source,
    binding,
    call_digest,
    canonical_json,
    sha256_hex,
    switches,
)
from approvald.store.repos.external import Checks, TokenRecord

__all__ = ["DEFAULT_WAIT", "EVENTS", "HTTP_MARGIN", "MARGIN", "MAX_EVENT", "MAX_HTTP_WAIT",
           "NAME", "POST", "POST_FAILED", "PRE", "SOURCE", "ClaudeCodeHook", "HookEvent",
           "HookEventError", "decision", "doing", "fail_closed"]

SOURCE = Source("hook", NAME)
CREDENTIAL = SOURCE.credential  # (a property of the source: read once, not per event)
RESULT_SUMMARY = 4000  # characters of a tool's response too large to record whole
EXCERPT = 1200  # characters of a file's new content or an edit shown on the card
# requests of one call a PreToolUse tries to take before it gives up: each that another
# call of it took first (two identical calls at once) sends it to the next
TAKES = 4


def _excerpt(text: Any) -> str:
    s = text if isinstance(text, str) else canonical_json(text)
    return s if len(s) <= EXCERPT else s[:EXCERPT] + f"… ({len(s)} characters in all)"


def doing(tool: str, args: dict[str, Any]) -> tuple[str, str | None]:
    """What the call does, in the words a reviewer of a coding agent reads first, and what
    it runs or writes (the card shows that verbatim, as a code block)."""
    if tool == "Bash" and isinstance(args.get("command"), str):
        return "runs the shell command", _excerpt(args["command"])
    path = args.get("file_path")
    if tool == "Write" and isinstance(path, str):
        return f"writes the file `{path}`", _excerpt(args.get("content", ""))
    if tool in ("Edit", "MultiEdit") and isinstance(path, str):
        if tool == "Edit":
            change = (f"- {_excerpt(args.get('old_string', ''))}\n"
                      f"+ {_excerpt(args.get('new_string', ''))}")
        else:
            change = _excerpt(args.get("edits", []))
        return f"edits the file `{path}`", change
    if tool.startswith("mcp__"):
        _, server, name = [*tool.split("__", 2), "", ""][:3]
        return f"calls the tool `{name}` of the MCP server `{server}`", None
    return f"uses its tool `{tool}`", None


class ClaudeCodeHook(CallerGate):
    """Decides one Claude Code event (see the module docstring)."""

    actor = "system:claude-code-hook"
    client = "Claude Code session"
    what = "Claude Code hook"
    started_is_over = True

    def __init__(self, engine: Engine, event: HookEvent, *, requested_by: str,
                 bearer: str | None = None, bearer_id: str | None = None) -> None:
        super().__init__(engine, SOURCE, requested_by=requested_by)
        self.event = event
        # over HTTP: the name of the bearer token the event came with. Its calls are its
        # own: another token's holder, knowing the session id, neither joins their
        # requests nor reports their results
        self.bearer = bearer
        # and its id, when it was read from memory: the request's statements check that
        # it is still live (as they check the hook's credential and its switch)
        self.bearer_id = bearer_id
        # the calls this process made, whoever's event asked (one hook per event)
        self._cursor = engine.call_cursor(CREDENTIAL)
        # which form of the hook this is: ``command``, or ``http`` over serve's listener
        # (each can be switched off alone: :mod:`runtime.record.switches`)
        self.form = "command" if bearer is None else "http"
        self._call: tuple[str, dict[str, Any], str] | None = None  # (tool, args, digest)

    @property
    def ledger_owner(self) -> str:
        """The execution ledger's owner of the call this event is about."""
        ev = self.event
        if self.bearer is None:
            return ev.owner
        return f"{NAME}:{self.bearer}:{ev.session_id}:{ev.tool_use_id}"[:200]

    def call_key(self, tool: str, args: dict[str, Any], call: str | None = None) -> str:
        """The same tool with the same input in the same session (from the same bearer
        token, over HTTP) is one call."""
        key: dict[str, Any] = {"session": self.event.session_id,
                               "call": call or self._digest(tool, args)}
        if self.bearer is not None:
            key["bearer"] = self.bearer
        return binding.shown(sha256_hex(canonical_json(key)))  # keyed: traces show it

    def _digest(self, tool: str, args: dict[str, Any]) -> str:
        """The call's digest, computed once for this event's call (its join key and its
        request are both made of it)."""
        if self._call is None or self._call[0] != tool or self._call[1] is not args:
            self._call = (tool, args, call_digest(tool, args))
        return self._call[2]

    def _new_request(self, tool: str, args: dict[str, Any], key: str,
                     digest: str | None = None) -> NewRequest:
        ev = self.event
        what, code = doing(tool, args)
        packet: dict[str, Any] = {
            # who asked is the face (the card names it from the request's source); this
            # says where: the project, the session, and over HTTP whose token
            "task": f"working in `{ev.cwd or '?'}` (session `{ev.session_id}`"
                    + (f", HTTP hook token `{self.bearer}`" if self.bearer else "") + ")",
            "doing": f"Claude Code {what}" + (":" if code is not None else "."),
        }
        if code is not None:
            packet["code"] = code
        # allowed at once (auto), the call runs now: its start is recorded with its request
        return NewRequest(tool=tool, args=args, requested_by=self.requested_by,
                          packet=packet, idempotency_key=key, start_owner=self.ledger_owner,
                          digest=self._digest(tool, args),
                          checks=Checks(live=(self.bearer_id,) if self.bearer_id else (),
                                        on=(switches.HOOK, self.form)))

    async def switched_off(self, found: TokenRecord, *, kept: bool = False) -> str | None:
        off = await self.e.switched_off(switches.HOOK, self.form, credential=found,
                                        kept=kept)
        if off is None:
            return None
        return (f"Claude Code's {self.form} hook is switched off by {off.off_by} at "
                f"{off.off_at:%Y-%m-%d %H:%M} UTC" + (f" ({off.reason})" if off.reason else "")
                + f"; an operator switches it on again with `approvald hook enable "
                  f"claude-code --{self.form}`")

    # -- before the call --------------------------------------------------------------------
    async def pre_tool_use(self, *, wait: float) -> dict[str, Any]:
        """The decision. The hook's credential and switch are taken from memory when this
        process read them before: the request's statements check both again (and the
        bearer token's life), and when they find one revoked or off, all are read again
        and the decision taken afresh. Still refused then: the bearer token was revoked
        (``unauthorized``, a 401 over HTTP)."""
        try:
            return await self._pre_tool_use(wait=wait, kept=True)
        except ExternalError as exc:
            if exc.code != "unauthorized":
                raise
            self.e.forget_kept()
            return await self._pre_tool_use(wait=wait, kept=False)

    async def _pre_tool_use(self, *, wait: float, kept: bool) -> dict[str, Any]:
        ev = self.event
        try:
            token = await self.token(kept=kept)
        except CallerOff as exc:
            message = f"approvald: {exc}. Nothing was allowed."
            if exc.token is None:
                return decision(False, message)
            return await self._refuse(exc.token, Refused("off", message))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait)
        for _ in range(TAKES):
            doc, started = await self._request(token, ev.tool_name, ev.tool_input)
            if started:  # allowed by the policy, its start recorded with its request
                return decision(True, self._allowed(doc))
            while doc["status"] in OPEN:
                left = deadline - loop.time()
                if left <= 0:
                    return await self._refuse(token, Refused(
                        "pending", await self._still_pending(doc), str(doc["id"])))
                self.heartbeat = left
                doc = await self._wait(token, doc, None)
            if doc["status"] != "approved":
                return decision(False, (await self.answer(token, doc)).message)
            rid = str(doc["id"])
            try:  # the allow takes the approval: the intent row is this tool use's
                await self.e.start_request(token, rid, args_digest=doc["effective_digest"],
                                           owner=self.ledger_owner)
            except ExternalError as exc:
                if exc.code == "already_started":
                    continue  # another call took it first: this one is a call of its own
                return await self._refuse(token, Refused(
                    exc.code, f"approvald: {ev.tool_name} was not allowed: {exc} "
                              f"(request {rid}).", rid))
            return decision(True, self._allowed(doc), dict(doc["effective_args"])
                            if doc["edited"] else None)
        return await self._refuse(token, Refused(
            "already_started", f"approvald: {ev.tool_name} was not allowed: {TAKES} requests "
                               "for this same call were each taken by another call of it "
                               "at the same time. Make the call again."))

    @staticmethod
    def _allowed(doc: dict[str, Any]) -> str:
        rid, d = doc["id"], doc.get("decision") or {}
        if d.get("decided_via") == "policy":
            why = f"allowed by the operator's policy for {doc['policy']} (request {rid})"
        else:
            why = f"approved by {d.get('decided_by') or '?'} (request {rid})"
        if doc["edited"]:
            return f"{why}, with edits by {doc.get('edited_by') or '?'}: run the edited input"
        return why

    async def _refuse(self, token: TokenRecord, out: Refused) -> dict[str, Any]:
        """Deny with ``out``, audited (a refusal of the hook's own, no decision behind it)."""
        ev = self.event
        await self.refused(token, ev.tool_name, out, session=ev.session_id,
                           tool_use_id=ev.tool_use_id,
                           **({"bearer": self.bearer} if self.bearer else {}))
        return decision(False, out.message)

    async def _still_pending(self, doc: dict[str, Any]) -> str:
        return (f"approvald: {self.event.tool_name} was not run: it is {await self.progress(doc)}"
                ". Make the same call again to join that request and learn its decision, "
                "or do something else meanwhile.")

    # -- after the call ---------------------------------------------------------------------
    async def post_tool_use(self) -> str | None:
        """Record what came of the call this tool use was allowed as; None when no request
        of this hook started it (a call the hook never saw), else the request id."""
        ev = self.event
        rid = await self.e.documents.started_by(self.ledger_owner)
        if rid is None:
            return None
        # a call allowed before the hook was switched off ran all the same: recorded
        token = await self.credential()
        doc = await self.e.request_document(token, rid)
        failed = ev.event == POST_FAILED
        # what ran is what Claude Code says ran (its event's input): an input other than
        # the approved one is recorded as what ran, the difference flagged
        rep = Report("failed" if failed else "succeeded", doc["effective_digest"],
                     ev.tool_response, ev.error if failed else None, ran=ev.tool_input)
        try:
            await self.e.record_request_report(token, rid, rep)
        except PayloadTooLarge:
            text = canonical_json(ev.tool_response)
            await self.e.record_request_report(token, rid, replace(rep, result={
                "truncated": True, "chars": len(text), "start": text[:RESULT_SUMMARY]}))
        return rid
