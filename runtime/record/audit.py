"""The audit log: append-only, chained with a key kept outside the database.

Each entry's MAC covers its own fields and the previous entry's MAC, so editing, deleting
or reordering any entry breaks the chain at a point :func:`verify` names. With a key
(``APPROVALD_AUDIT_KEY``, never stored in the database) the MAC is an HMAC: someone who
can write the database but does not hold the key cannot recompute the chain after a
change. A head (``seq:mac``) recorded outside the database (printed by every
``audit verify``, optionally posted to Slack) proves that nothing up to it was changed,
even by someone who does hold the key, and that nothing was cut off the end.

Entries are recorded inside the caller's transaction and chained as its last
statements (a ``before_commit`` hook), so the chain head's lock is held briefly and
always last (see :mod:`store.db` for the lock order).

No entry holds a secret (issue 34): its details are recorded masked, as the cards show
them (the request's sensitive paths, and what the detectors find anywhere, results and
errors too), and each value masking changed is named under ``masked`` with the SHA-256
of its real value's canonical JSON. So the chain is verified, and exported masked,
without the data key; ``audit export --reveal``, with it, shows the real arguments read
from the sealed request they belong to, where their digest matches. Entries written
before this (their details sealed at rest whole) still open, verify and export with
the key.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import hmac
import io
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from approvald.runtime.kernel import binding, prefix
from approvald.runtime.kernel.canonical import (
    canonical_json,
    compact_json,
    sha256_hex,
    value_digest,
)
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.policies.detectors import none_in_json
from approvald.runtime.policies.sensitive import ARGS_KEYS, masked_details, sensitive_of_snapshot
from approvald.runtime.record.audit_check import ChainFacts, opened, table_disagreements
from approvald.runtime.record.outbox_kinds import HEAD_POST, HeadPost, Payload, queue, queue_many
from approvald.runtime.record.standing_chain import StandingState
from approvald.store.db import Database
from approvald.store.errors import NothingWritten
from approvald.store.jsontext import loads
from approvald.store.records import AuditRecord, VoteRecord
from approvald.store.repos import End, Tx
from approvald.store.repos.audit import GENESIS, TOGETHER, Head
from approvald.store.repos.external import Rider
from approvald.store.repos.standing import StandingRecord

ACTIONS = frozenset({
    "requested", "reminded", "voted", "approved", "denied", "redirected", "edited", "expired",
    "escalated", "superseded", "executed", "outcome_unknown", "outcome_resolved", "cancelled",
    "not_executed", "cannot_run_resolved",
    "cancel_requested", "refused", "repeated", "failed", "needs_attention", "resumed",
    # a call run again after an attempt cut off before its result (a crash): why it was
    # safe to, and its attempt number
    "retried",
    "standing_granted", "standing_revoked", "token_created", "token_revoked", "policy_loaded",
    # a face (a form of Claude Code's hook) switched off, and on again
    "face_disabled", "face_enabled",
    "revealed", "resealed",
    # the web review queue: a sign-in link mailed, a sign-in, a refused sign-in or request
    "web_link_sent", "web_signed_in", "web_signed_out", "web_refused",
    # a request mailed to its approvers because Slack did not take its card
    "mailed_instead",
})
_PENDING = "audit.pending"  # Tx.scratch key: entries recorded, not yet chained
_RIDER = "audit.along"  # Tx.scratch key: a request answered at once, inserted with them
# the key of recorded details that names what masking changed, with its real digest
MASKED = "masked"
# details keys under which a request's sensitive paths apply (see masked_details)
_PATH_ROOTS = frozenset(k.split(".", 1)[0] for k in ARGS_KEYS)
_PATHS_KEPT = 4096  # requests whose sensitive paths a trail remembers
# characters of a call's result an ``executed`` entry quotes: the ledger keeps the whole
# result; every call that runs has an entry, so this is paid once per call
RESULT_EXCERPT = 500


_UNREAD: Any = object()


def result_excerpt(text: str | None, value: Any = _UNREAD) -> Any:
    """What an ``executed`` entry records of a result (its JSON text): the value when it
    is short, else its first :data:`RESULT_EXCERPT` characters and ``…``. ``value``:
    ``text`` decoded already, when the caller holds it (not decoded again)."""
    if text is None:
        return None
    if len(text) > RESULT_EXCERPT:
        return text[:RESULT_EXCERPT] + "…"
    return json.loads(text) if value is _UNREAD else value


def recorded_details(details: Mapping[str, Any],
                     sensitive: Sequence[str] = ()) -> dict[str, Any]:
    """``details`` as the chain records them: masked like a card (``sensitive``: the
    request's sensitive paths; the detectors everywhere), and each top-level value that
    masking changed named under ``masked`` with the digest of its real value."""
    masked = masked_details(details, sensitive)
    # (masking keeps the keys in their order: each value beside its masked form; one the
    # walk only copied, a tuple as a list, is recorded as it was: not named)
    changed = {k: value_digest(v) for (k, v), shown in zip(details.items(), masked.values(),
                                                           strict=True)
               if shown != v and compact_json(shown) != compact_json(v)}
    if changed:
        masked[MASKED] = changed
    return masked


def recorded_text(details: Mapping[str, Any], sensitive: Sequence[str] = ()) -> str:
    """The compact JSON of :func:`recorded_details`: where no sensitive path applies (none
    declared, or no key the paths are under) and no detector finds anything in the
    details' JSON, they are recorded as they are (masking would change nothing), without
    walking them value by value (issue 50: most entries)."""
    if not sensitive or _PATH_ROOTS.isdisjoint(details):
        text = compact_json(details)
        if none_in_json(text):
            return text
    return compact_json(recorded_details(details, sensitive))


class AuditKey:
    """The chain's HMAC key. Its fingerprint (``id``) is stored with each entry so that
    after a rotation :func:`verify` knows which key each entry needs."""

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        if len(raw) < 16:
            raise ConfigError("APPROVALD_AUDIT_KEY: a key needs at least 16 bytes")
        self._key = hashlib.sha256(b"approvald-audit-v1\x00" + raw).digest()
        self.id = hashlib.sha256(b"approvald-audit-key-id\x00" + raw).hexdigest()[:12]
        # an export's rows are MACed under a key of their own (see export_mac)
        self._export = hmac.new(self._key, EXPORT_LABEL, hashlib.sha256).digest()

    def mac(self, text: str) -> str:
        # (hmac.digest: the same MAC in one call into OpenSSL, no HMAC object made)
        return hmac.digest(self._key, text.encode("utf-8"), "sha256").hex()

    def macs(self) -> Callable[[str], str]:
        """:meth:`mac`, for a reader checking many texts: the keyed state is made once and
        copied for each (the same MACs, in about 60% of the time)."""
        keyed = hmac.new(self._key, digestmod=hashlib.sha256)

        def mac(text: str) -> str:
            h = keyed.copy()
            h.update(text.encode("utf-8"))
            return h.hexdigest()
        return mac

    def export_mac(self, text: str) -> str:
        return hmac.new(self._export, text.encode("utf-8"), hashlib.sha256).hexdigest()


# An exported row's own MAC (recipe v1): what leaves the database shows keyed bindings, not
# the plain digests each entry's chain MAC covers (invariant 20), so an export cannot be
# checked against the chain MACs alone. Each row carries ``export_mac`` = "v1:" + hex of
# HMAC-SHA-256 under K_export of the canonical JSON (sorted keys, no whitespace, UTF-8) of
# the row without ``export_mac``: its fields as exported (bindings, masked details), and
# the chain's ``hash`` and ``prev_hash``, so a row is tied to its place in the chain.
# K_export = HMAC-SHA-256(K, "approvald-export-v1"), K = SHA-256("approvald-audit-v1\0" +
# the audit key) (the key the entry names by ``key_id``); an unkeyed entry's is a plain
# SHA-256 of "approvald-export-v1\n" + that JSON. Documented in docs/how-to/audit.md.
EXPORT_MAC = "export_mac"
EXPORT_RECIPE = "v1"
EXPORT_LABEL = b"approvald-export-v1"


def export_mac(key: AuditKey | None, row: Mapping[str, Any]) -> str:
    """The export MAC of exported ``row`` (recipe :data:`EXPORT_RECIPE`) under ``key``, the
    key its entry names (None: an unkeyed entry)."""
    text = canonical_json({k: v for k, v in row.items() if k != EXPORT_MAC})
    mac = key.export_mac(text) if key is not None else \
        sha256_hex(EXPORT_LABEL.decode() + "\n" + text)
    return f"{EXPORT_RECIPE}:{mac}"


def entry_hash(key: AuditKey | None, prev_hash: str, *, seq: int, at: datetime, action: str,
               actor: str, via: str, run_id: str | None, approval_id: str | None,
               digest: str | None, details: str) -> str:
    """The MAC of one entry: HMAC with ``key``, or plain SHA-256 for an unkeyed entry."""
    fields: dict[str, Any] = {
        "seq": seq, "at": at.isoformat(), "action": action, "actor": actor, "via": via,
        "run_id": run_id, "approval_id": approval_id, "digest": digest,
        "details": loads(details),
    }
    if key is not None:  # bound in, so an entry cannot be passed off as another key's
        fields["kid"] = key.id
    text = prev_hash + "\n" + canonical_json(fields)
    return key.mac(text) if key is not None else sha256_hex(text)


@dataclass(frozen=True)
class Entry:
    """One audit entry waiting to be chained."""

    at: datetime
    action: str
    actor: str
    via: str
    run_id: str | None = None
    approval_id: str | None = None
    digest: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # the sensitive paths of the call its details hold; None: those of its request
    # (``approval_id``'s stored policy), or none without one
    sensitive: tuple[str, ...] | None = None


# the outbox rows (payload, group) what a transaction audited calls for, worked out from
# the entries alone: no statement, no read (see AuditTrail.follow)
Follower = Callable[[Sequence[Entry]], Sequence[tuple[Payload, str]]]


class AuditTrail:
    """Records entries in the caller's transaction; they are chained when it commits."""

    def __init__(self, key: AuditKey | None = None) -> None:
        self.key = key
        self._followers: list[Follower] = []
        # approval id -> its sensitive paths (a request's stored policy never changes)
        self._paths: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        # the head (seq, hash, time) as this process's last chaining left it, committed
        # or about to be (or, while it runs, will leave it: worked out as it arrived): the
        # next chaining appends to it without reading the head first, and reads it (under
        # its lock) only when it moved otherwise (another process, a transaction rolled
        # back)
        self._head: Head | None = None
        # the last chaining's head statement: its result, the head it left (None: unknown)
        self._turn: asyncio.Future[Head | None] | None = None
        # group commit: the batches still taking members, by what they write (see _together)
        self._open: dict[Any, _Batch] = {}
        self._leading: set[asyncio.Task[None]] = set()  # their statements' tasks

    def follow(self, fn: Follower) -> None:
        """Queue the outbox rows ``fn(entries)`` names with what each write transaction
        audited, in that transaction. Every transition of a request is audited, so this is
        where what must follow a transition, whichever path made it (a click, the CLI, the
        expiry sweep, a cancel), is made durable with it: the decision webhook of a
        caller's request (:mod:`runtime.runs.external`). ``fn`` reads nothing: the work the row
        stands for is done by the drain, in a transaction of its own, so it never runs in,
        slows or rolls back the transaction that decided."""
        self._followers.append(fn)

    def record(self, tx: Tx, *, at: datetime, action: str, actor: str, via: str,
               run_id: str | None = None, approval_id: str | None = None,
               digest: str | None = None, details: dict[str, Any] | None = None,
               sensitive: Sequence[str] | None = None) -> None:
        """Add one entry to ``tx`` (chained, in recording order, just before COMMIT).
        ``sensitive``: the sensitive paths of the call ``details`` holds, when it has no
        request (``approval_id``) whose stored policy says them."""
        self.record_many(tx, [Entry(at=at, action=action, actor=actor, via=via, run_id=run_id,
                                    approval_id=approval_id, digest=digest,
                                    details=details or {},
                                    sensitive=None if sensitive is None
                                    else tuple(sensitive))])

    def record_many(self, tx: Tx, entries: Sequence[Entry]) -> None:
        for e in entries:
            if e.action not in ACTIONS:
                raise ValueError(f"unknown audit action {e.action!r}")
        pending: list[Entry] | None = tx.scratch.get(_PENDING)
        if pending is None:
            pending = tx.scratch[_PENDING] = []
            tx.before_commit(self._chain)
        pending.extend(entries)

    def ride(self, tx: Tx, rows: Rider) -> None:
        """Have the statement that chains ``tx``'s entries write ``rows`` too (on
        PostgreSQL: a request answered at once, :meth:`~store.repos.external.ExternalRepo.
        add_answered`, or a kept call's report, :meth:`~store.repos.external.ExternalRepo.
        report_kept`): one statement records the decision (or the result) and its audit
        entries."""
        if _PENDING not in tx.scratch:
            tx.scratch[_PENDING] = []
            tx.before_commit(self._chain)
        tx.scratch[_RIDER] = rows

    async def _chain(self, tx: Tx) -> None:
        entries: list[Entry] = tx.scratch.pop(_PENDING, [])
        along: Rider | None = tx.scratch.pop(_RIDER, None)
        if tx.alone and (not entries or along is None):
            # a write sent alone is the rider's rows and its entries in one statement
            raise NothingWritten
        if not entries:
            if along is not None:
                await tx.external.add_answered_now(along)
            return
        if follow := [row for fn in self._followers for row in fn(entries)]:
            if tx.alone:  # the outbox's rows would be a statement of their own
                raise NothingWritten
            await queue_many(tx, follow, now=max(e.at for e in entries))
        wanted = self._wanted(entries)
        paths: Mapping[str, tuple[str, ...]] = {}
        if wanted:  # (none: no entry holds the arguments of a request, most answers)
            if tx.alone and self._unknown_paths(wanted):  # a read first: not alone
                raise NothingWritten
            paths = await self._sensitive(tx, wanted)
        # each entry's recorded details, masked and in JSON once: a chaining that finds
        # the head moved chains them again (seq, time, MAC) without redoing them
        texts = [self._text(e, paths) for e in entries]
        # this process's chainings send their head statements in the order they chain:
        # each after the one before was answered (it holds the head's lock then), so it
        # reaches the head after that one and, once that one commits, finds the head it
        # guessed (the server would have made it wait for that lock all the same). Its
        # rows are worked out as it arrives, chained to the head the chaining before it
        # is about to leave (``self._head``), so that the turn, which the next chaining
        # waits for, is held for the statement's round trip alone (issue 50: the turn is
        # what one process's auto decisions queue in); they are worked out again only if
        # that chaining left another head. Each statement still checks the head it
        # guessed: a wrong guess writes nothing (or is chained again under the lock).
        loop = asyncio.get_running_loop()
        before = self._turn
        waits = before is not None and not before.done() and before.get_loop() is loop
        if waits and tx.alone and along is not None:
            end = tx.lend()
            if end is not None:  # a statement in flight: written with the others meanwhile
                await self._together(tx, end, entries, texts, along)
                return
        turn = loop.create_future()
        self._turn = turn
        guess = self._head
        rows = self._rows(entries, texts, *guess) if guess is not None else None
        after = self._head = None if rows is None else _after(rows)
        left: Head | None = None  # the head this chaining leaves: the next one's guess
        try:
            if waits:
                assert before is not None
                # (awaited directly: the turn's future is this chaining's alone, and its
                # result wakes it in one turn of the event loop)
                stood = await before
                if stood != guess:  # that chaining left another head: chained to it
                    guess = stood
                    rows = self._rows(entries, texts, *guess) if guess is not None else None
                    after = None if rows is None else _after(rows)
            if tx.alone:
                # one statement, sent alone (PostgreSQL, autocommit): it writes the rider's
                # rows and the entries chained to the head guessed, or nothing at all
                # (NothingWritten: the caller writes them again as a transaction, which
                # reads the head under its lock)
                if guess is None or rows is None or along is None:
                    raise NothingWritten
                await tx.audit.append_alone(rows, seq=guess[0], hash=guess[1], along=along)
                left = after
                return
            head = None
            if guess is not None and rows is not None:  # the head guessed: not read
                # (KeyTaken: the transaction rolls back, the head is not that one)
                head = await tx.audit.append_if_head(rows, seq=guess[0], hash=guess[1],
                                                     along=along)
                if head is None:
                    left = after
                    return
                along = None  # inserted all the same
                # the head moved otherwise: the statement returned it as it stands, its
                # lock held, and the entries are chained to it
            if along is not None:  # before the head's lock: it is held for less
                await tx.external.add_answered_now(along)
            rows = self._rows(entries, texts, *(head or await tx.audit.lock_head()))
            left = _after(rows)  # (written unless the transaction rolls back)
            await tx.audit.append_rows(rows)
        except BaseException:
            left = None  # not chained, or not known to be
            raise
        finally:
            if self._turn is turn:  # no chaining came after this one: the head it left
                self._head = left
            if not turn.done():  # (cancelled: by the next chaining's own cancellation)
                turn.set_result(left)

    # -- group commit: the writes sent alone while one is in flight, sent together ----------

    async def _together(self, tx: Tx, end: End, entries: list[Entry], texts: list[str],
                        along: Rider) -> None:
        """Write ``tx``'s rider and entries (a write sent alone, :meth:`ride`) with the
        others of its kind and shape that arrive while this process's statement before
        is in flight: one batch, one statement, in the next turn. The first to come opens
        the batch, which takes the turn after the last one taken, and hands it its
        connection (``end`` ends it); the next ones join it, and their connections go
        back at once (none waits holding one). Given the turn, the batch's task sends
        ONE statement, every member's rows and entries chained one after the other from
        the head the statement before left (``AuditRepo.append_together``): written
        whole, or :class:`~store.errors.NothingWritten` to each (each then writes alone,
        as a transaction, where a member whose key was taken or token revoked is refused
        and the others are written), or its error (a connection lost: outcome unknown)
        to each. A member cancelled before the batch is sent is left out of it; once it
        is sent, the statement goes on (it runs in a task of its own, on the connection
        handed over, so the first member's cancellation, a hook's budget, does not cut
        it under the others). At most :data:`~store.repos.audit.TOGETHER` members a batch:
        the next one opens another, in the turn after."""
        key = (type(along), along.shape, len(entries))
        batch = self._open.get(key)
        lead = batch is None
        if batch is None:
            batch = self._open[key] = self._lead(tx, end, key)
        member = batch.join(self, entries, texts, along)
        if len(batch.members) >= TOGETHER:
            del self._open[key]  # full: the next one opens another
        if self._turn is batch.turn:  # the head it will leave, as it stands
            self._head = batch.tail
        try:
            if not lead:  # the batch has a connection: this one's is not needed
                await end(None)
            await member.done
        except BaseException:
            member.done.cancel()  # (left out, unless the batch was sent already)
            raise

    def _lead(self, tx: Tx, end: End, key: Any) -> _Batch:
        """A batch, in the turn after the last one taken, sent by a task of its own on
        ``tx``'s connection (ended by ``end``)."""
        loop = asyncio.get_running_loop()
        before, turn = self._turn, loop.create_future()
        assert before is not None
        self._turn = turn
        batch = _Batch(key, turn, self._head)
        task = loop.create_task(self._send(batch, before, tx, end))
        self._leading.add(task)
        task.add_done_callback(self._leading.discard)
        return batch

    async def _send(self, batch: _Batch, before: asyncio.Future[Head | None], tx: Tx,
                    end: End) -> None:
        """Batch ``batch``'s turn: after the chaining ``before`` is answered, its members
        (those still waiting) in one statement; its result to each of them."""
        left: Head | None = None  # the head it leaves: the next chaining's guess
        failed: BaseException | None = None
        try:
            stood = await before
            if self._open.get(batch.key) is batch:
                del self._open[batch.key]  # closed: the next one opens another
            members = [m for m in batch.members if not m.done.done()]
            if members:
                if stood is None:  # the head unknown (the chaining before failed)
                    raise NothingWritten
                head = stood
                written: list[tuple[list[dict[str, Any]], Rider]] = []
                for m in members:  # chained again only from where the guess went wrong
                    rows = m.rows
                    if m.start != head or rows is None:
                        m.start, m.rows = head, (rows := self._rows(m.entries, m.texts, *head))
                    written.append((rows, m.along))
                    head = _after(rows)
                if self._turn is batch.turn:
                    self._head = head
                await tx.audit.append_together(written, seq=stood[0], hash=stood[1])
                left = head
            else:  # every member left: the head as the one before left it
                left = stood
        except BaseException as exc:
            failed, left = exc, None
        finally:
            if self._turn is batch.turn:
                self._head = left
            if not batch.turn.done():
                batch.turn.set_result(left)
            for m in batch.members:
                m.settle(failed)
            await end(failed)

    @staticmethod
    def _text(e: Entry, paths: Mapping[str, tuple[str, ...]]) -> str:
        """``e``'s details as the chain records them (masked, compact JSON): nothing in
        them depends on where the entry is chained (its seq, time, the MAC before it)."""
        hidden = e.sensitive if e.sensitive is not None \
            else paths.get(e.approval_id or "", ())
        return recorded_text(e.details, hidden)

    def _rows(self, entries: Sequence[Entry], texts: Sequence[str], seq: int,
              prev: str, last: datetime | None) -> list[dict[str, Any]]:
        """``entries`` (their recorded details ``texts``) as rows chained after entry
        ``seq`` (hash ``prev``, time ``last``)."""
        kid = self.key.id if self.key is not None else ""
        rows = []
        # an entry's time is when it was recorded, never before the entry it follows (a
        # clock read before another transaction chained its entries, a standing use whose
        # request was stamped after its decision was worked out): times never run back
        for e, text in zip(entries, texts, strict=True):
            at = e.at if last is None or e.at >= last else last
            last = at
            seq += 1
            h = entry_hash(self.key, prev, seq=seq, at=at, action=e.action, actor=e.actor,
                           via=e.via, run_id=e.run_id, approval_id=e.approval_id,
                           digest=e.digest, details=text)
            rows.append({"seq": seq, "at": at, "action": e.action, "actor": e.actor,
                         "via": e.via, "run_id": e.run_id, "approval_id": e.approval_id,
                         "digest": e.digest, "details": text, "key_id": kid,
                         "prev_hash": prev, "hash": h})
            prev = h
        return rows

    def knows(self, approval_id: str, policy: str | None) -> None:
        """Note request ``approval_id``'s sensitive paths from its stored policy, which the
        caller holds (a decision's locked row): its entries are chained without reading
        them (issue 50: a process that decides a request another process made)."""
        if approval_id not in self._paths:
            self._remember(approval_id, policy)

    def _remember(self, approval_id: str, policy: str | None) -> None:
        self._paths[approval_id] = sensitive_of_snapshot(policy)
        while len(self._paths) > _PATHS_KEPT:
            self._paths.popitem(last=False)

    @staticmethod
    def _wanted(entries: Sequence[Entry]) -> set[str]:
        return {e.approval_id for e in entries if e.sensitive is None and e.approval_id
                and not _PATH_ROOTS.isdisjoint(e.details)}

    def _unknown_paths(self, wanted: set[str]) -> bool:
        """Whether chaining the entries that want ``wanted`` (:meth:`_wanted`) reads a
        request's sensitive paths first."""
        return any(a not in self._paths for a in wanted)

    async def _sensitive(self, tx: Tx, wanted: set[str]) -> dict[str, tuple[str, ...]]:
        """The sensitive paths of the requests ``wanted`` (:meth:`_wanted`: those whose
        entries hold a call's arguments), read once per request and process: one query for
        those a transaction first names."""
        missing = [a for a in wanted if a not in self._paths]
        if missing:
            found = await tx.approvals.policies(missing)
            for aid, snapshot in found.items():  # (a request not found is asked again)
                self._remember(aid, snapshot)
        return {a: self._paths.get(a, ()) for a in wanted}


def _after(rows: Sequence[Mapping[str, Any]]) -> tuple[int, str, datetime | None]:
    last = rows[-1]
    return int(last["seq"]), str(last["hash"]), last["at"]


class _Member:
    """A write sent alone, waiting in a batch (:meth:`AuditTrail._together`): its rider,
    its entries, and its rows as chained after ``start`` (None: not yet)."""

    __slots__ = ("along", "done", "entries", "rows", "start", "texts")

    def __init__(self, entries: list[Entry], texts: list[str], along: Rider,
                 done: asyncio.Future[None]) -> None:
        self.entries, self.texts, self.along, self.done = entries, texts, along, done
        self.start: Head | None = None
        self.rows: list[dict[str, Any]] | None = None

    def settle(self, failed: BaseException | None) -> None:
        """Tell the member (unless it left) what its batch's statement did."""
        if self.done.done():
            return
        if failed is None:
            self.done.set_result(None)
        elif isinstance(failed, NothingWritten):
            self.done.set_exception(NothingWritten())  # (one each: each is raised)
        elif isinstance(failed, asyncio.CancelledError):
            self.done.cancel()
        else:
            self.done.set_exception(failed)


class _Batch:
    """The writes sent alone that one statement will carry, in the turn ``turn``."""

    __slots__ = ("key", "members", "tail", "turn")

    def __init__(self, key: Any, turn: asyncio.Future[Head | None],
                 tail: Head | None) -> None:
        self.key = key
        self.turn = turn
        self.members: list[_Member] = []
        # the head its last member's rows leave, as guessed (None: not known yet)
        self.tail = tail

    def join(self, trail: AuditTrail, entries: list[Entry], texts: list[str],
             along: Rider) -> _Member:
        """Add a member, its rows worked out now, chained after the member before's."""
        member = _Member(entries, texts, along, asyncio.get_running_loop().create_future())
        if self.tail is not None:
            member.start = self.tail
            member.rows = trail._rows(entries, texts, *self.tail)
            self.tail = _after(member.rows)
        self.members.append(member)
        return member


# -- a witness outside the database ----------------------------------------------------



async def queue_head(db: Database, *, now: datetime) -> tuple[int, str] | None:
    """Queue the chain head for posting (to the audit channel), unless the last one queued
    is already this head; returns the head queued, or None."""
    async with db.write() as tx:
        seq, digest = await tx.audit.head()
        last = await tx.outbox.latest(HEAD_POST)
        if seq == 0 or (last is not None and last.payload_value().get("seq") == seq):
            return None
        await queue(tx, HeadPost(seq=seq, hash=digest, at=now.isoformat()),
                    group_key=HEAD_POST, now=now)
    return seq, digest


# -- verification ----------------------------------------------------------------------

@dataclass
class VerifyReport:
    entries: int = 0
    head: tuple[int, str] = (0, GENESIS)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unkeyed: int = 0  # entries that only a recorded head protects against a writer
    # why the chain could not be checked at all (its entries are keyed, and no key was
    # given): nothing is known to be wrong, nor proven right
    cannot: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and self.cannot is None

    @property
    def head_text(self) -> str:
        return f"{self.head[0]}:{self.head[1]}"


def parse_head(text: str) -> tuple[int, str]:
    """``"SEQ:HASH"`` as printed by ``audit verify``; ValueError when it is not one."""
    seq, sep, digest = text.strip().partition(":")
    if not sep or not seq.isdigit() or len(digest) != 64 or \
            any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"not an audit head {text!r} (expected SEQ:HASH as printed by "
                         "`approvald audit verify`)")
    return int(seq), digest


def no_key(e: AuditRecord) -> str:
    """Why a keyed chain cannot be checked without its key (never that it is broken)."""
    return (f"{_describe(e)} and those after it are signed with audit key {e.key_id}, and "
            "no key was given: the chain cannot be verified here (nothing is known to be "
            "wrong); set APPROVALD_AUDIT_KEY (and APPROVALD_AUDIT_OLD_KEYS for retired "
            "keys) to verify it")


def _describe(e: AuditRecord) -> str:
    return f"entry {e.seq} ({e.action} by {e.actor} at {e.at.isoformat()})"


def mac_matches(key: AuditKey | None, e: AuditRecord) -> bool:
    """Whether ``e``'s MAC is the one its fields and the MAC before it make (``key``: the
    key it names; None for an unkeyed entry)."""
    recomputed = entry_hash(key, e.prev_hash, seq=e.seq, at=e.at, action=e.action,
                            actor=e.actor, via=e.via, run_id=e.run_id,
                            approval_id=e.approval_id, digest=e.digest, details=e.details)
    return hmac.compare_digest(recomputed, e.hash)


class EntryKeys:
    """Which key each entry of a walk along the chain needs, one entry after another (the
    database's chain, :func:`verify`, and an exported file's, ``runtime/record/audit_file.py``):
    an entry names its key by fingerprint; with keys given, every entry after the first
    ``unkeyed_until`` must be keyed, and none after a keyed one may be unkeyed."""

    def __init__(self, keys: Sequence[AuditKey], unkeyed_until: int) -> None:
        self.keys = keys
        self.by_id = {k.id: k for k in keys}
        self.unkeyed_until = unkeyed_until
        self.seen_keyed = False

    def key_for(self, e: AuditRecord, report: VerifyReport) -> tuple[bool, AuditKey | None]:
        """``(True, its key)`` (None: it is unkeyed, and may be), or ``(False, None)``
        with why it cannot be checked in ``report`` (the walk stops there)."""
        if not e.key_id:
            if self.seen_keyed or (self.keys and e.seq > self.unkeyed_until):
                report.problems.append(
                    f"{_describe(e)} is not keyed, but entries after {self.unkeyed_until} "
                    "must be: it was rewritten by someone without the key (if it predates "
                    "the key, set APPROVALD_AUDIT_UNKEYED_UNTIL to the last entry written "
                    "before it)")
                return False, None
            report.unkeyed += 1
            return True, None
        key = self.by_id.get(e.key_id)
        if key is None and not self.keys:
            report.cannot = no_key(e)
            return False, None
        if key is None:
            report.problems.append(
                f"{_describe(e)} is signed with audit key {e.key_id}, which was not given: "
                "set APPROVALD_AUDIT_KEY (or APPROVALD_AUDIT_OLD_KEYS for a retired key)")
            return False, None
        self.seen_keyed = True
        return True, key


class ChainWalk:
    """The checks of each entry in a walk along the chain, in seq order: none missing,
    each following the one before, keyed as it must be, and its MAC recomputed. A walk
    may start after a point already verified (``start``: its seq and MAC)."""

    def __init__(self, report: VerifyReport, keys: Sequence[AuditKey], unkeyed_until: int,
                 start: tuple[int, str] = (0, GENESIS), *, keyed: bool = False) -> None:
        self.report = report
        self.keys = EntryKeys(keys, unkeyed_until)
        self.keys.seen_keyed = keyed
        self.prev_seq, self.prev_hash = start

    @property
    def seen_keyed(self) -> bool:
        """Whether a keyed entry was walked (none after it may be unkeyed)."""
        return self.keys.seen_keyed

    @seen_keyed.setter
    def seen_keyed(self, value: bool) -> None:
        self.keys.seen_keyed = value

    def check(self, e: AuditRecord) -> bool:
        """Check ``e``, the next entry; False (and the report says why) if it fails."""
        report = self.report
        report.entries += 1
        prev_seq = self.prev_seq
        if e.seq != prev_seq + 1:
            missing = (f"entry {prev_seq + 1}" if e.seq == prev_seq + 2
                       else f"entries {prev_seq + 1}-{e.seq - 1}")
            report.problems.append(
                f"{missing} deleted: the log jumps from {prev_seq} to {e.seq}")
            return False
        if e.prev_hash != self.prev_hash:
            report.problems.append(
                f"{_describe(e)} does not follow entry {prev_seq}: reordered, or the "
                "entry before it was rewritten")
            return False
        if not self.mac_matches(e):
            return False
        self.prev_seq, self.prev_hash = e.seq, e.hash
        return True

    def mac_matches(self, e: AuditRecord) -> bool:
        """``e`` is keyed as it must be and its MAC is its content's (else the report
        says why, and False)."""
        usable, key = self.keys.key_for(e, self.report)
        if not usable:
            return False
        if not mac_matches(key, e):
            self.report.problems.append(
                f"{_describe(e)} was edited: its content does not match its MAC")
            return False
        return True

    def reached_head(self) -> bool:
        """The walk ended at the head the walk read first (else the report says why)."""
        seq, digest = self.report.head
        if (seq, digest) == (self.prev_seq, self.prev_hash):
            return True
        if seq > self.prev_seq:
            self.report.problems.append(
                f"entries {self.prev_seq + 1}-{seq} deleted from the end of the log")
        else:
            self.report.problems.append(
                f"the chain head (entry {seq}) does not match the last entry {self.prev_seq}")
        return False


async def verify(db: Database, *, keys: Sequence[AuditKey] = (),
                 expect: tuple[int, str] | None = None,
                 unkeyed_until: int = 0,
                 visit: Callable[[AuditRecord], None] | None = None) -> VerifyReport:
    """Walk the chain up to its head; report the first break and what kind it is.

    ``keys``: the current key and any retired ones (entries name theirs by fingerprint).
    With keys, every entry must be keyed except the first ``unkeyed_until`` (written
    before the deployment had a key: a number the operator keeps outside the database,
    so a writer cannot pass a rewritten chain off as old and unkeyed).
    ``expect``: a head recorded earlier outside the database; the chain must still pass
    through it, and must not end before it. ``visit``: called with each entry once its
    MAC is checked (a reader of the record walks the chain once, not twice); trust what
    it saw only when the report is ok.
    """
    expected: list[str] = []

    def seen(e: AuditRecord) -> None:
        if expect is not None and e.seq == expect[0]:
            expected.append(e.hash)
        if visit is not None:
            visit(e)

    verifier = ChainVerifier(keys=keys, unkeyed_until=unkeyed_until, visit=seen)
    # one snapshot, and the head read first: entries appended during the walk are not
    # the walk's business, and cannot look like entries deleted from the end
    async with db.read(snapshot=True) as tx:
        report, tables = await verifier.walk(tx)
    if tables is None:
        return report
    if expect is not None:
        seq, digest = expect
        head_seq = report.head[0]
        if seq > head_seq:
            report.problems.append(
                f"the log ends at entry {head_seq}, but a head at entry {seq} was recorded: "
                f"entries {head_seq + 1}-{seq} were deleted")
        elif seq > 0 and expected[-1:] != [digest]:
            report.problems.append(
                f"entry {seq} is not the one recorded ({digest[:16]}…): the history up to it "
                "was rewritten")
        else:
            report.notes.append(f"the chain passes through the recorded head {seq}:{digest}")
    verifier.conclude(report, tables)
    return report


def still_verified(e: AuditRecord | None, head: tuple[int, str], report: VerifyReport,
                   what: str, unedited: Callable[[AuditRecord, VerifyReport], bool]) -> bool:
    """``e``, read again, is entry ``head`` (seq and MAC) as verified before: still there,
    its MAC recomputed from its content (``unedited``), and the one verified (an edit, or
    a rewrite that re-chained the history up to it, is caught); else the report says why.
    ``what``: how the entry was verified, for the report."""
    seq, digest = head
    if e is None or e.seq != seq:
        report.problems.append(f"entry {seq}, {what}, was deleted")
        return False
    if not unedited(e, report):
        return False
    if not hmac.compare_digest(e.hash, digest):
        report.problems.append(
            f"entry {seq} is not the one verified ({digest[:16]}…): the history up to it "
            "was rewritten")
        return False
    return True


@dataclass
class Compared:
    """The rows a check compared with the chain, in its snapshot: every vote, and every
    standing approval (its scope opened where a data key opens it). A caller that checks
    these rows too (the model-based test, after every step) takes them from here rather
    than reading them again."""

    votes: list[VoteRecord] = field(default_factory=list)
    standing: list[StandingRecord] = field(default_factory=list)


class ChainVerifier:
    """:func:`verify` that can be resumed: each :meth:`check` walks only the entries
    appended since the head it verified last, and compares the tables with the whole
    chain as :func:`verify` does (a watcher that verifies a growing chain again and again
    pays for each entry's MAC once, not once a pass).

    The head it verified last is held here, outside the database, as a head passed to
    ``expect`` is: the chain must still end at or after it (a log cut back and its head
    moved back is caught), and that entry must still be there with the same MAC,
    recomputed from its content (an edit to it, or a rewrite of the history before it
    that re-chained up to it, is caught). What a resumed check does not recheck is the
    content of the entries before that one: an entry edited there, the chain left broken
    after it, is caught by a full :func:`verify` (or a new verifier's first check), not
    by a resumed check. Problems the replay of walked entries found (a use of a standing
    approval its grant did not cover) stay in every later report."""

    def __init__(self, *, keys: Sequence[AuditKey] = (), unkeyed_until: int = 0,
                 visit: Callable[[AuditRecord], None] | None = None) -> None:
        self.keys = keys
        self.unkeyed_until = unkeyed_until
        self.visit = visit
        self._start()

    def _start(self) -> None:
        """From the beginning of the chain (as new, or after a check found it broken)."""
        self.compared = Compared()  # the rows the last check compared with the chain
        self.head: tuple[int, str] = (0, GENESIS)  # verified through (seq, MAC)
        self._keyed = False  # a keyed entry was walked (none after it may be unkeyed)
        self._unkeyed = 0
        self._found: list[str] = []  # problems the replay of walked entries found
        self._standing = StandingState()
        self._facts = ChainFacts()

    async def check(self, tx: Tx) -> VerifyReport:
        """Verify the chain in ``tx`` (a snapshot), from the head verified last; the report
        is a full :func:`verify`'s (without ``expect``), its counts over the whole chain."""
        report, tables = await self.walk(tx)
        if tables is not None:
            self.conclude(report, tables)
        return report

    async def walk(self, tx: Tx) -> tuple[VerifyReport, list[str] | None]:
        """The walk from the head verified last to the chain's head, and the tables'
        disagreements with the whole chain (None: the walk broke, the report says where,
        and the next check starts from the beginning of the chain again)."""
        report = VerifyReport(entries=self.head[0], unkeyed=self._unkeyed,
                              problems=list(self._found))
        self.compared = Compared()
        report.head = await tx.audit.head()
        if not await self._walk(tx, report):
            self._start()
            return report, None
        # the rows the views show, against what the chain proves (issue 52)
        tables = await table_disagreements(tx, self._facts, votes_read=self.compared.votes)
        return report, tables + await _standing_rows(tx, self._standing,
                                                     self.compared.standing)

    async def _walk(self, tx: Tx, report: VerifyReport) -> bool:
        head_seq = report.head[0]
        start_seq = self.head[0]
        if head_seq < start_seq:
            report.problems.append(
                f"the log ends at entry {head_seq}, but it was verified through entry "
                f"{start_seq}: entries {head_seq + 1}-{start_seq} were deleted")
            return False
        walk = ChainWalk(report, self.keys, self.unkeyed_until, self.head, keyed=self._keyed)
        # from the entry verified last (read again, in the statement that reads the new)
        entries = tx.audit.iterate(after=max(start_seq - 1, 0), upto=head_seq)
        if start_seq and not self._still_there(await anext(entries, None), report):
            return False
        async for e in entries:
            if not walk.check(e):
                return False
            found = len(report.problems)
            _replay_standing(self._standing, e, report)
            self._found += report.problems[found:]
            self._facts.apply(e)
            self.head, self._keyed, self._unkeyed = \
                (e.seq, e.hash), walk.seen_keyed, report.unkeyed
            if self.visit is not None:
                self.visit(e)
        return walk.reached_head()

    def _still_there(self, e: AuditRecord | None, report: VerifyReport) -> bool:
        """``e`` (read again) is the entry verified last, unchanged (else the report says
        why)."""
        return still_verified(e, self.head, report, "verified earlier", self._unedited)

    def _unedited(self, e: AuditRecord, report: VerifyReport) -> bool:
        key = next((k for k in self.keys if k.id == e.key_id), None)
        if (e.key_id and key is None) or not mac_matches(key, e):
            report.problems.append(
                f"{_describe(e)} was edited since it was verified: its content does not "
                "match its MAC")
            return False
        return True

    def conclude(self, report: VerifyReport, tables: list[str]) -> None:
        """Add the tables' disagreements and what the walk proved to ``report``."""
        report.problems += tables
        if not tables:
            report.notes.append("the approvals, votes and standing approvals tables agree "
                                "with the chain")
        if self._standing.uses:
            report.notes.append(f"{self._standing.uses} calls that standing approvals let run "
                                "were each covered by a grant recorded in the chain")
        if report.unkeyed and self.keys:
            report.notes.append(
                f"{report.unkeyed} entries were written without an audit key: only a head "
                "recorded outside the database protects them from someone who can write it")
        elif report.unkeyed:
            report.notes.append(
                "no audit key is set (APPROVALD_AUDIT_KEY): the chain detects accidental "
                "damage, but someone who can write the database can rewrite it; compare the "
                "head with one recorded elsewhere (--expect)")


async def _standing_rows(tx: Tx, state: StandingState,
                         read: list[StandingRecord]) -> list[str]:
    """Each standing approval whose row says otherwise than its grants and revocation in
    the chain (``state``: the whole chain replayed); each row compared is appended to
    ``read`` (its scope opened where it can be)."""
    out: list[str] = []
    after, batch = "", 500
    while True:
        rows = await tx.standing.every(after=after, batch=batch)
        for s in rows:
            scope, unreadable = opened(s.scope, "standing_approvals.scope")
            if unreadable:
                out.append(f"standing approval {s.id}: its scope {unreadable}")
            row = replace(s, scope=compact_json(scope)) if scope is not None else s
            read.append(row)
            why = state.disagrees(row, unread=() if scope is not None else ("scope_value",))
            if why is not None:
                out.append(f"standing approval {s.id}: {why}")
        if len(rows) < batch:  # the last page (no statement asks for one past the end)
            return out
        after = rows[-1].id


def _replay_standing(state: StandingState, e: AuditRecord, report: VerifyReport) -> None:
    """Follow standing approvals through the chain; a call one let run that its audited
    grant did not cover (revoked, expired, out of scope, another subject or policy) is a
    problem: the grant on record never allowed it, whatever the database's rows said."""
    if e.action not in ("standing_granted", "standing_revoked") and \
            not (e.action == "approved" and e.via == "standing"):
        return
    details: dict[str, Any] = json.loads(e.details)
    if e.action != "approved":
        state.apply(e.action, details, e.at)
        return
    if "subject" not in details:
        return  # a use recorded before uses named their subject: nothing to compare
    sid = str(details.get("standing_approval"))
    why = state.covered(sid, at=e.at, subject=details.get("subject"),
                        digest=details.get("policy_digest"), tool=str(details.get("tool")),
                        args=details.get("args") or {},
                        band=(details["approvers"], details.get("quorum"))
                        if "approvers" in details else None, call=e.digest)
    if why is None:
        state.uses += 1
    else:
        report.problems.append(f"{_describe(e)} ran a call on standing approval {sid}, which "
                               f"did not cover it: {why}")


# -- export ------------------------------------------------------------------------------

EXPORT_FIELDS = ("seq", "at", "action", "actor", "via", "run_id", "approval_id", "tool", "digest",
                 "args", "reason", "details", "key_id", "prev_hash", "hash", EXPORT_MAC)
# a cell a spreadsheet would read as a formula (OWASP's CSV injection guidance)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def export_row(e: AuditRecord, sensitive: Sequence[str] | None = None, *,
               details: dict[str, Any] | None = None,
               keys: Mapping[str, AuditKey] | None = None) -> dict[str, Any]:
    """One entry as exported (``details``: its details, if not as recorded);
    ``sensitive`` (its request's sensitive paths) given: with those values, and every
    secret the detectors find, masked (entries written before the chain recorded them
    masked hold them in clear). The digests it recorded (the call's, and each masked
    value's) are exported as their bindings (``runtime/kernel/binding.py``): an export names the
    arguments it is about without giving a masked value back to whoever tries candidates.
    ``keys`` (the audit keys by fingerprint) given: the row carries its export MAC
    (:func:`export_mac`), when the key its entry names is among them, so that
    ``audit verify --file`` proves the row, bindings included, with the key."""
    if details is None:
        details = json.loads(e.details)
    if sensitive is not None:
        details = masked_details(details, sensitive)
    # what leaves the database binds with keyed bindings, never plain digests (invariant 20)
    details = binding.shown_details(details)
    row: dict[str, Any] = {
        "seq": e.seq, "at": e.at.isoformat(), "action": e.action, "actor": e.actor,
        "via": e.via, "run_id": e.run_id, "approval_id": e.approval_id,
        "tool": details.get("tool"),
        "digest": binding.shown_opt(e.digest),
        "args": details.get("args"),
        "reason": details.get("reason"), "details": details, "key_id": e.key_id,
        "prev_hash": e.prev_hash, "hash": e.hash,
    }
    if keys is not None and (not e.key_id or e.key_id in keys):
        row[EXPORT_MAC] = export_mac(keys.get(e.key_id) if e.key_id else None, row)
    return row


def csv_cell(value: Any) -> Any:
    """A cell that a spreadsheet shows as text: a leading ``'`` before anything that
    starts like a formula. The JSON lines export keeps every value exactly as recorded."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


async def export(db: Database, *, run_id: str | None = None, since: datetime | None = None,
                 fmt: str = "jsonl", batch: int = 500,
                 reveal: bool = False, keys: Sequence[AuditKey] = ()) -> AsyncIterator[str]:
    """Yield the matching entries as JSON lines or CSV text (header first), reading the
    log in batches so an export of any size runs in constant memory.

    Sensitive values (each request's declared paths, and what the detectors find) are
    masked unless ``reveal``: then the arguments an entry recorded masked are shown as
    they are held, sealed, in their request (where the digest recorded for them matches
    its arguments or their edit; any other value stays masked), and entries written
    before the chain was masked as recorded. Revealing reads the sealed requests, so it
    needs the data key; the caller audits a revealing export before it starts.

    ``run_id``: only that run's entries; a full id or an unambiguous prefix, as everywhere
    (:func:`runtime.kernel.prefix.resolve`). A run that does not exist is :class:`NotFound`,
    raised before anything is yielded: an export is never silently empty by mistake.

    ``keys``: the audit keys (the current one and retired ones); each row whose entry's
    key is among them (and each unkeyed one) carries its export MAC, which ``audit verify
    --file`` checks with the key. A revealing export carries none: its values are not
    the ones the chain recorded, and it is not to pass for them.
    """
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"unknown export format {fmt!r} (jsonl or csv)")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=EXPORT_FIELDS)
    async with db.read(snapshot=True) as tx:
        if run_id is not None:
            run_id = (await prefix.resolve("run", run_id, tx.runs.get, tx.runs.find,
                                           field="run_id")).id
        if fmt == "csv":
            writer.writeheader()
            yield _take(buf)
        hidden: dict[str, Sequence[str]] = {}
        by_id = {k.id: k for k in keys}
        held: dict[str, dict[str, Any]] = {}  # approval id -> {digest: real arguments}
        async for e in tx.audit.iterate(run_id=run_id, since=since, batch=batch):
            paths: Sequence[str] | None = None
            details: dict[str, Any] = json.loads(e.details)
            if reveal:
                details = await _revealed(tx, e, details, held)
            else:
                key = e.approval_id or ""
                if key not in hidden:  # (its policy alone: no sealed value is read)
                    policy = (await tx.approvals.policies([key])).get(key) if key else None
                    hidden[key] = sensitive_of_snapshot(policy)
                    if len(hidden) > 4096:
                        hidden.clear()
                paths = hidden.get(key, ())
            row = export_row(e, paths, details=details, keys=None if reveal else by_id)
            if fmt == "jsonl":
                yield json.dumps(row, ensure_ascii=False) + "\n"
                continue
            for key in ("args", "details"):
                row[key] = "" if row[key] is None else canonical_json(row[key])
            writer.writerow({k: csv_cell(v) for k, v in row.items()} | {
                EXPORT_MAC: row.get(EXPORT_MAC, "")})
            yield _take(buf)


async def _revealed(tx: Tx, e: AuditRecord, details: dict[str, Any],
                    held: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``details`` with each value recorded masked that ``e``'s request holds (by digest)
    in clear; ``held``: what requests were read already, kept for the next entries."""
    digests = details.get(MASKED)
    if not isinstance(digests, dict) or not e.approval_id:
        return details
    real = held.get(e.approval_id)
    if real is None:
        a = await tx.approvals.get(e.approval_id)
        real = {} if a is None else {
            value_digest(v): v for v in (a.args_value(), a.effective_args())}
        if len(held) > 4096:
            held.clear()
        held[e.approval_id] = real
    return {**details, **{k: real[d] for k, d in digests.items() if d in real}}


def _take(buf: io.StringIO) -> str:
    text = buf.getvalue()
    buf.seek(0)
    buf.truncate()
    return text
