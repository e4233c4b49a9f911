"""The outbox's contract: every kind of row, its typed payload, the face that delivers it,
and the mail threads.

A row is written in the transaction that changes what it tells (state first, request
second), by :func:`queue`, from one of the payloads below: the payload's class says its
kind and its shape, so a writer and the face that delivers the row read one definition.
The faces declare the kinds they deliver (a deliverer's ``kinds``); :class:`Routes` hands
each row to the face that declared its kind, and ``serve`` refuses to start while a kind
has no face to deliver it (:meth:`Routes.check`), rather than find out row by row.

One kind is the runtime's own (:data:`RUNTIME_KINDS`): a caller's request that a
transaction may have ended (:class:`RequestDecided`) is followed up by the runtime itself,
in the drain, in a transaction of its own (the decision webhook it queues is then a face's
row like any other); no face declares it, and the drain routes it to the runtime.

The mails of a request form one thread, in one outbox group (:func:`mail_group`): the
request mail first, then what became of it, its reminders and its edits, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, Protocol

from approvald.runtime.kernel.canonical import compact_json
from approvald.runtime.kernel.errors import ApprovaldError, ConfigError
from approvald.store.records import ApprovalRecord, OutboxRecord
from approvald.store.repos import Tx

# -- the kinds -------------------------------------------------------------------------------
CARD_POST = "approval.requested"  # post a request's card
CARD_UPDATE = "approval.updated"  # redraw it (a vote, a decision, an edit, an expiry)
REMINDER = "approval.reminder"  # remind its approvers
NOTICE = "tool.notice"  # a notify_after call ran: tell the run's thread
RUN_WAITING = "run.waiting"  # a run started waiting (an outage, a rate limit, a backoff)
HEAD_POST = "audit.head"  # post the audit chain's head where the database cannot reach
DEAD_REPORT = "delivery.dead"  # tell ops that another row could not be delivered
WEBHOOK = "api.webhook"  # POST a decision document to a caller's URL
REQUEST_MAIL = "mail.request"  # a request mailed to its approvers
OUTCOME_MAIL = "mail.outcome"  # in the request mail's thread: what became of it
REMINDER_MAIL = "mail.reminder"  # ... its reminders
EDIT_MAIL = "mail.edited"  # ... its arguments were edited: who changed what, what binds now
SIGN_IN_MAIL = "mail.signin"  # a sign-in link for the web review queue
# a caller's request may have ended: its webhook is queued, its run ended (runtime.runs.external)
REQUEST_DECIDED = "request.decided"

APPROVAL_KINDS = frozenset({CARD_POST, CARD_UPDATE, REMINDER})  # about one approval's card
MAIL_KINDS = frozenset({REQUEST_MAIL, OUTCOME_MAIL, REMINDER_MAIL, EDIT_MAIL, SIGN_IN_MAIL})
RUNTIME_KINDS = frozenset({REQUEST_DECIDED})  # delivered by the runtime's own route


# -- the payloads ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Payload:
    """A row's payload; ``kind`` is the kind of row it makes. Stored as compact JSON, the
    fields in the order declared, a field that is None left out."""

    kind: ClassVar[str]

    def encode(self) -> str:
        # the instance's fields as __init__ set them, in declared order (JSON values all:
        # no nested dataclass for asdict to convert, nor its deep copy to pay for)
        return compact_json({k: v for k, v in self.__dict__.items() if v is not None})


@dataclass(frozen=True)
class CardPost(Payload):
    kind = CARD_POST
    approval_id: str


@dataclass(frozen=True)
class CardUpdate(Payload):
    kind = CARD_UPDATE
    approval_id: str


@dataclass(frozen=True)
class Reminder(Payload):
    kind = REMINDER
    approval_id: str
    n: int  # which reminder (1, 2, ...)


@dataclass(frozen=True)
class Notice(Payload):
    kind = NOTICE
    run_id: str
    call_id: str
    args: dict[str, Any]
    seq: int  # told after the run's events before it (the call's result)
    sensitive: list[str]  # the call's declared sensitive paths: masked wherever shown


@dataclass(frozen=True)
class RunWaiting(Payload):
    kind = RUN_WAITING
    run_id: str
    until: str  # ISO time
    reason: str
    seq: int


@dataclass(frozen=True)
class HeadPost(Payload):
    kind = HEAD_POST
    seq: int
    hash: str
    at: str  # ISO time


@dataclass(frozen=True)
class DeadReport(Payload):
    kind = DEAD_REPORT
    outbox_id: int
    # the dead row's kind (a field named ``kind`` would hide the class's)
    dead_kind: str
    attempts: int
    waits: int
    error: str
    approval_id: str | None = None
    run_id: str | None = None
    call_id: str | None = None

    def encode(self) -> str:
        data = {k: v for k, v in asdict(self).items() if v is not None}
        data = {"outbox_id": data.pop("outbox_id"), "kind": data.pop("dead_kind"), **data}
        return compact_json(data)


@dataclass(frozen=True)
class Webhook(Payload):
    kind = WEBHOOK
    run_id: str
    token_id: str
    url: str
    event: str
    document: dict[str, Any]


@dataclass(frozen=True)
class RequestDecided(Payload):
    kind = REQUEST_DECIDED
    run_id: str  # the request's (its run's id)
    approval_id: str | None = None  # the approval an entry ended; None: its run was cancelled


@dataclass(frozen=True)
class RequestMail(Payload):
    kind = REQUEST_MAIL
    approval_id: str
    fallback: bool | None = None  # True: mailed because Slack did not take its card


@dataclass(frozen=True)
class OutcomeMail(Payload):
    kind = OUTCOME_MAIL
    approval_id: str


@dataclass(frozen=True)
class ReminderMail(Payload):
    kind = REMINDER_MAIL
    approval_id: str
    n: int


@dataclass(frozen=True)
class EditMail(Payload):
    kind = EDIT_MAIL
    approval_id: str
    by: str
    via: str
    at: str  # ISO time
    mode: str
    previous_digest: str
    digest: str
    changes: list[list[Any]]  # (path, before, after), masked where sensitive
    more: int
    discarded: list[str]


@dataclass(frozen=True)
class SignInMail(Payload):
    kind = SIGN_IN_MAIL
    link_id: str
    user: str


PAYLOADS: Mapping[str, type[Payload]] = {p.kind: p for p in (
    CardPost, CardUpdate, Reminder, Notice, RunWaiting, HeadPost, DeadReport, Webhook,
    RequestDecided, RequestMail, OutcomeMail, ReminderMail, EditMail, SignInMail)}
KINDS: frozenset[str] = frozenset(PAYLOADS)  # every kind a row may have


def payload_of(row: OutboxRecord) -> Payload:
    """``row``'s payload, typed (keys a later version added are ignored)."""
    cls = PAYLOADS.get(row.kind)
    if cls is None:
        raise ValueError(f"unknown outbox kind {row.kind!r}")
    data = row.payload_value()
    if cls is DeadReport:
        data = {**data, "dead_kind": data.pop("kind", "")}
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


async def queue(tx: Tx, payload: Payload, *, group_key: str, now: datetime,
                give_up_at: datetime | None = None) -> None:
    """Add a row of ``payload``'s kind to the outbox, in ``tx``."""
    await tx.outbox.add(kind=payload.kind, group_key=group_key, payload=payload.encode(),
                        now=now, give_up_at=give_up_at)


async def queue_many(tx: Tx, rows: Sequence[tuple[Payload, str]], *, now: datetime) -> None:
    """Add ``(payload, group_key)`` rows to the outbox in one statement, in ``tx``."""
    await tx.outbox.add_many([(p.kind, group, p.encode()) for p, group in rows], now=now)


# -- the mail thread of a request ------------------------------------------------------------
def mail_group(approval_id: str) -> str:
    """The outbox group of a request's mails: its request mail first, then its thread."""
    return f"{REQUEST_MAIL}:{approval_id}"


async def mailed(tx: Tx, approval_ids: Sequence[str], *, given_up: bool = True) -> set[str]:
    """Those of ``approval_ids`` whose request was mailed (or is on its way): by their
    policy, or because Slack did not take their cards; with ``given_up=False`` not those
    whose mail was given up (nobody got it: there is no thread to follow)."""
    groups = await tx.outbox.groups_having(
        REQUEST_MAIL, [mail_group(i) for i in approval_ids],
        statuses=("pending", "delivered", "dead") if given_up else ("pending", "delivered"))
    return {g.removeprefix(f"{REQUEST_MAIL}:") for g in groups}


async def tell_mailed(tx: Tx, approval_ids: Sequence[str], now: datetime) -> None:
    """Requests just closed (decided anywhere, expired, escalated, cancelled): those that
    were mailed get a follow-up in their mail's thread saying what became of them."""
    for approval_id in sorted(await mailed(tx, approval_ids, given_up=False)):
        await queue(tx, OutcomeMail(approval_id), group_key=mail_group(approval_id), now=now)


async def queue_closed(tx: Tx, card: Payload, approval_id: str, now: datetime) -> None:
    """A request just closed: its card's update queued, and (as :func:`tell_mailed`) the
    follow-up in its mail's thread if it was mailed, in one statement."""
    row, follow, having, statuses = closed_rows(card, approval_id)
    await tx.outbox.add_if_group(row, follow, having=having, statuses=statuses, now=now)


ClosedRows = tuple[tuple[str, str, str], tuple[str, str, str], str, tuple[str, ...]]


def closed_rows(card: Payload, approval_id: str) -> ClosedRows:
    """What :func:`queue_closed` queues: the card's row, the mail's follow-up, and the kind
    and statuses of the row that says the request was mailed."""
    return ((card.kind, approval_id, card.encode()),
            (OUTCOME_MAIL, mail_group(approval_id), OutcomeMail(approval_id).encode()),
            REQUEST_MAIL, ("pending", "delivered"))


Changes = tuple[Sequence[tuple[str, str | None, str | None]], int]


async def tell_edited(tx: Tx, a: ApprovalRecord, *, changed: Callable[[], Changes],
                      digest: str, by: str, via: str, mode: str, discarded: Sequence[str],
                      now: datetime) -> None:
    """An edit of ``a`` (to digest ``digest``), by ``by`` through ``via``: if ``a`` was
    mailed, its mail thread is told who changed what (``changed()``: each changed field,
    masked where sensitive, and how many more, :func:`runtime.requests.packet.edit_changes`; the
    payload holds nothing else of the arguments) and that the request now binds to the
    new arguments."""
    if not await mailed(tx, [a.id], given_up=False):
        return
    changes, more = changed()
    await queue(tx, EditMail(
        approval_id=a.id, by=by, via=via, at=now.isoformat(), mode=mode,
        previous_digest=a.effective_digest, digest=digest,
        changes=[list(c) for c in changes], more=more, discarded=list(discarded)),
        group_key=mail_group(a.id), now=now)


# -- delivering ------------------------------------------------------------------------------
class RetryLater(ApprovaldError):
    """The row could not be delivered now; try again later.

    With ``after`` the far side said when (a rate limit's ``Retry-After``): that is a wait,
    not a failure, and the row tries again exactly then. Without it the row backs off.
    """

    def __init__(self, message: str, *, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after


class Undeliverable(ApprovaldError):
    """The row can never be delivered (bad channel, message too long): park it as dead."""


@dataclass(frozen=True)
class Mail:
    """One message a mail row becomes: ``to`` is its To header; ``bcc``, when given, are
    its envelope recipients instead (approvers do not see each other's addresses)."""

    to: str
    subject: str
    text: str
    bcc: tuple[str, ...] = ()
    # a follow-up: the Message-ID of the mail it answers (In-Reply-To and References)
    in_reply_to: str | None = None


class MailSender(Protocol):
    """What sends a mail: the web face's SMTP mailer, or the sandbox's mailbox."""

    sender: str  # the From address

    async def send(self, mail: Mail) -> str:
        """Send ``mail``; its Message-ID. RetryLater / Undeliverable as the outbox reads
        them."""
        ...


class Route(Protocol):
    """A face's deliverer: the kinds it declares, and one row of them -> an effect in the
    outside world (what to remember of it, or None). It raises ``RetryLater`` or
    ``Undeliverable`` (:mod:`runtime.record.outbox`) when it cannot."""

    kinds: frozenset[str]

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None: ...


class Routes:
    """Each row to the face that declared its kind. Two faces declaring one kind is a
    mistake in the build, refused at once."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self._by_kind: dict[str, Route] = {}
        for route in routes:
            for kind in sorted(route.kinds):
                if kind in self._by_kind:
                    raise ConfigError(f"outbox kind {kind} is delivered by both "
                                      f"{type(self._by_kind[kind]).__name__} and "
                                      f"{type(route).__name__}")
                self._by_kind[kind] = route

    def route(self, kind: str) -> Route:
        """The face that delivers ``kind`` (:class:`Undeliverable` when none does: the
        drain parks the row as dead, and reports it)."""
        found = self._by_kind.get(kind)
        if found is None:
            raise Undeliverable(f"no face delivers outbox kind {kind!r}")
        return found

    def missing(self) -> list[str]:
        """The kinds of :data:`KINDS` no face delivers (the runtime's own aside), sorted."""
        return sorted(KINDS - RUNTIME_KINDS - set(self._by_kind))

    def check(self) -> None:
        """Refuse (one line) a build in which a kind has no route: its rows would wait in
        the outbox until they die, and nobody would see why."""
        if missing := self.missing():
            raise ConfigError(f"outbox kind{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)}: no face delivers "
                              f"{'them' if len(missing) > 1 else 'it'}; declare "
                              f"{'them' if len(missing) > 1 else 'it'} in a deliverer's "
                              "kinds (runtime/record/outbox_kinds.py)")

    async def prepare(self, rows: Sequence[OutboxRecord]) -> None:
        """Let each face that reads ahead (a ``prepare`` of its own) read what the rows of
        its kinds in a batch need, once for them all, before they are delivered."""
        ahead: dict[int, tuple[Any, list[OutboxRecord]]] = {}
        for row in rows:
            route = self._by_kind.get(row.kind)
            prepare = getattr(route, "prepare", None)
            if prepare is not None:
                ahead.setdefault(id(route), (prepare, []))[1].append(row)
        for prepare, mine in ahead.values():
            await prepare(mine)

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        return await self.route(row.kind).deliver(row)
