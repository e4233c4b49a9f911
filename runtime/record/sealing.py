"""Secrets sealed at rest (issue 34): authenticated encryption under the operator's key.

The columns that hold a call's exact arguments or what came of them (the pending call,
its edit and its decision packet, the run's task, transcript, in-flight call, result and
error, the execution ledger, a standing approval's scope, an API request's arguments, an
adapter's paused state, calls and outcome, an outbox row's payload, which may quote them,
and the columns that hold errors) are listed in one registry of the schema,
:mod:`store.caller_data`, and are :class:`~approvald.store.types.SealedText`: whatever repository
writes or reads them, the text goes through the process's :class:`Sealer`. With a data
key (``APPROVALD_DATA_KEY``), each of their values is stored as
``{"$sealed": "<key id>:<base64 of nonce and ciphertext>"}``: AES-256-GCM, with the
column's name as associated data, so a sealed value opens only where it was written
(copied into another column it fails to open, and an altered one fails its tag). Every
value is sealed, not only those a detector recognises: a declared sensitive value needs no
finding, and sealing (a few microseconds) costs less than looking for secrets would.

Everything the runtime reads is opened first, so the digest still covers the real
arguments and the run executes exactly the approved call. A sealed value that no key
of this process opens (no key, a lost key) raises
:class:`~approvald.runtime.kernel.errors.ConfigError` naming ``APPROVALD_DATA_KEY`` from
inside the statement that read it: the transaction it was part of changes nothing.

Without a key, values are stored as given (as before sealing existed), and the first
secret a detector finds in a request's arguments is told once in a warning; unless the
operator set ``APPROVALD_REQUIRE_DATA_KEY``: then storing a detected secret in clear, in
any of those columns, is refused.
Keys rotate like the audit key: the current key seals, retired keys
(``APPROVALD_DATA_OLD_KEYS``) still open, and ``approvald keys reseal`` seals every
value again under the current key. A long-running process takes a new ring without a
restart (:meth:`Sealer.rekey`; ``serve`` on SIGHUP), and re-reads its keys by itself
(``reread``, at most every :data:`REREAD_EVERY` seconds) when it meets a value sealed
under a key it lacks: where the keys come from files (``APPROVALD_SECRETS_DIR``), a
rotation done in any order heals itself.

A value that does not open is the operator's to fix, and each part that meets it (the
worker's poll, the outbox drain, an expiry job) meets it again at its next turn until it
is fixed: :class:`OneLineRefusals` tells it in one line per key and kind of failure, at
most once a minute, instead of a traceback each time.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Literal

from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.policies.sensitive import mask_text
from approvald.runtime.record.state import FINAL_STATUSES
from approvald.store import sealed
from approvald.store.db import Database

log = logging.getLogger(__name__)

PREFIX = '{"$sealed":"'
SUFFIX = '"}'
NONCE = 12
KEY_ID_LENGTH = 12  # hex digits of a key's fingerprint
# where a process without a key looks for a secret to warn about (once): a request's
# arguments, written once per request, never on a step's or a click's path
WARN_COLUMNS = frozenset({"approvals.args", "external_requests.args"})
REREAD_EVERY = 5.0  # s: the least time between two re-reads of the keys a value asked for
TELL_EVERY = 60.0  # s: a refusal to open is told once in this long (per key and kind)
Failure = Literal["missing", "altered"]


class DataKeyError(ConfigError):
    """A sealed value this process has no key to open (or one that fails to open): the
    operator's to fix, so nothing that needed it is counted as having failed.
    ``key_id``: the key it needs; ``failure``: missing (this process lacks that key) or
    altered (it does not open under it)."""

    def __init__(self, message: str, *, key_id: str, failure: Failure) -> None:
        super().__init__(message)
        self.key_id = key_id
        self.failure = failure


class DataKey:
    """One data key: AES-256 derived from the operator's secret, and its fingerprint
    (``id``), stored with each sealed value so that the key that opens it is known."""

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        if len(raw) < 16:
            raise ConfigError("APPROVALD_DATA_KEY: a key needs at least 16 bytes")
        # the cipher's package loaded where a key is (a deployment without one never seals)
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(hashlib.sha256(b"approvald-data-v1\x00" + raw).digest())
        self.id = hashlib.sha256(b"approvald-data-key-id\x00" + raw).hexdigest()[:KEY_ID_LENGTH]

    def seal(self, text: str, aad: bytes) -> str:
        nonce = os.urandom(NONCE)
        box = self._aead.encrypt(nonce, text.encode("utf-8"), aad)
        return f"{self.id}:{base64.b64encode(nonce + box).decode('ascii')}"

    def open(self, token: str, aad: bytes) -> str:
        """The value ``token`` seals; ValueError if it does not open under this key (altered,
        moved, or not a token)."""
        from cryptography.exceptions import InvalidTag  # (loaded with the cipher already)

        raw = base64.b64decode(token)
        try:
            return self._aead.decrypt(raw[:NONCE], raw[NONCE:], aad).decode("utf-8")
        except InvalidTag:
            raise ValueError("it does not open under this key") from None


def is_sealed(text: str) -> bool:
    """Whether ``text`` is a sealed value as stored."""
    return text.startswith(PREFIX) and text.endswith(SUFFIX)


def key_id(text: str) -> str | None:
    """The id of the key a sealed value was sealed under (None: not sealed)."""
    return text[len(PREFIX):].split(":", 1)[0] if is_sealed(text) else None


class Sealer:
    """Seals and opens the sensitive columns' text (see the module's docstring).

    ``keys``: the current key first, then retired ones that still open. ``require``:
    refuse to store a detected secret in clear when there is no key. ``reread``: where
    the keys come from, read again when a value needs a key this ring lacks (at most
    every ``reread_every`` seconds of ``monotonic``). ``on_refused``: told of each value
    that does not open (a metric)."""

    def __init__(self, keys: Sequence[DataKey] = (), *, require: bool = False,
                 reread: Callable[[], Sequence[DataKey]] | None = None,
                 reread_every: float = REREAD_EVERY,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.keys: list[DataKey] = []
        self._by_id: dict[str, DataKey] = {}
        self._set(keys)
        self.require = require
        self._warned = False
        self.reread = reread
        self.reread_every = reread_every
        self._monotonic = monotonic
        self._reread_at: float | None = None
        self.on_refused: Callable[[DataKeyError], None] | None = None

    @property
    def current(self) -> DataKey | None:
        return self.keys[0] if self.keys else None

    def _set(self, keys: Sequence[DataKey]) -> None:
        self.keys = list(keys)
        self._by_id = {k.id: k for k in self.keys}

    def rekey(self, keys: Sequence[DataKey]) -> bool:
        """Take a new key ring (the current key first), from now on; whether it differs.
        A ring with no key is refused (:class:`ConfigError`) once this one has a key: a
        running process never goes from sealing to writing in clear."""
        if not keys and self.keys:
            raise ConfigError("APPROVALD_DATA_KEY is not set any more: keeping data key "
                              f"{self.keys[0].id} (a process that seals never stops "
                              "sealing; restart it without a key to store values in clear)")
        before = [k.id for k in self.keys]
        self._set(keys)
        return before != [k.id for k in self.keys]

    def _reread_for(self, kid: str) -> DataKey | None:
        """The key ``kid`` after reading the ring again, if it is time to."""
        now = self._monotonic()
        if self.reread is None or (self._reread_at is not None
                                   and now - self._reread_at < self.reread_every):
            return None
        self._reread_at = now
        try:
            if self.rekey(self.reread()):
                log.info("data keys re-read for a value sealed under data key %s: %s",
                            kid, self.describe())
        except ConfigError as exc:  # the files are mid-change, say: the ring stays as it was
            log.warning("data keys not re-read: %s", exc)
        return self._by_id.get(kid)

    def describe(self) -> str:
        """The ring in a few words: ``data key ID seals, ID, ID retired``."""
        if self.current is None:
            return "no data key: values are stored as given"
        retired = ", ".join(k.id for k in self.keys[1:]) or "none"
        return f"data key {self.current.id} seals, {retired} retired"

    def _refused(self, exc: DataKeyError) -> DataKeyError:
        if self.on_refused is not None:
            self.on_refused(exc)
        return exc

    # what :meth:`open` gives back as it is: every text not starting with this (the
    # store's columns ask it to open only the others: store/types.py)
    sealed_prefix = PREFIX

    def seal(self, text: str, column: str) -> str:
        # (current and is_sealed inline: every sealed column of every row written)
        key = self.keys[0] if self.keys else None
        if key is None:
            if text.startswith(PREFIX) and text.endswith(SUFFIX):
                # stored in clear, it would read back as a sealed value no key opens: a
                # caller could make a request nobody can read
                raise ConfigError(f"APPROVALD_DATA_KEY is not set: a value shaped like a "
                                  f"sealed one cannot be stored in clear ({column})")
            if (self.require or (not self._warned and column in WARN_COLUMNS)) \
                    and mask_text(text) != text:
                if self.require:
                    raise ConfigError(
                        "APPROVALD_DATA_KEY is not set and APPROVALD_REQUIRE_DATA_KEY is: "
                        f"refusing to store a secret in clear ({column})")
                self._warned = True
                log.warning("a secret is stored in clear (%s): set APPROVALD_DATA_KEY to "
                            "seal sensitive values at rest", column)
            return text
        return PREFIX + key.seal(text, column.encode()) + SUFFIX

    def open(self, text: str, column: str) -> str:
        if not (text.startswith(PREFIX) and text.endswith(SUFFIX)):  # (is_sealed, inline:
            return text  # every sealed column of every row read comes through here)
        kid, _, token = text[len(PREFIX):-len(SUFFIX)].partition(":")
        key = self._by_id.get(kid) or self._reread_for(kid)
        if key is None:
            raise self._refused(DataKeyError(
                f"APPROVALD_DATA_KEY: a sealed value ({column}) needs the data key {kid}, "
                "which this process does not have (set APPROVALD_DATA_KEY, or list the "
                "retired key in APPROVALD_DATA_OLD_KEYS)", key_id=kid, failure="missing"))
        try:
            return key.open(token, column.encode())
        except ValueError:
            raise self._refused(DataKeyError(
                f"APPROVALD_DATA_KEY: a sealed value ({column}) does not open under the "
                f"data key {kid}: it was altered or moved", key_id=kid,
                failure="altered")) from None

    def reseal(self, text: str, column: str) -> str:
        """``text`` as stored, as it would be stored now: sealed under the current key
        (opened with the retired key it needs), or sealed for the first time."""
        current = self.current
        if current is None:
            raise ConfigError("APPROVALD_DATA_KEY: set the key to seal values under "
                              "(and the retired ones in APPROVALD_DATA_OLD_KEYS)")
        if key_id(text) == current.id:
            return text
        return self.seal(self.open(text, column), column)


async def reseal(db: Database, sealer: Sealer, *, batch: int = sealed.BATCH
                 ) -> dict[str, int]:
    """Seal every sensitive column's value again under ``sealer``'s current key (values
    sealed under a retired key, and values stored in clear before there was a key; the
    audit log's details, written masked and in clear, only where they were sealed before),
    in batches of ``batch`` rows, each its own transaction; the number rewritten in each
    table. Safe to rerun, and to run beside ``serve``. A value no key opens stops it with
    a :class:`ConfigError`, its batch unchanged."""
    if sealer.current is None:
        raise ConfigError("APPROVALD_DATA_KEY is not set: there is no key to reseal under")
    return await sealed.rewrite(db, sealer.reseal, sealed_prefix=PREFIX, batch=batch)


async def check(db: Database, sealer: Sealer) -> None:
    """Refuse to start (:class:`DataKeyError`, one line) when waiting requests or runs are
    sealed under a key ``sealer`` does not have: a server without it could decide and
    resume nothing they hold."""
    known = {k.id for k in sealer.keys}
    missing = await sealed.waiting_key_ids(db, final=FINAL_STATUSES, sealed_prefix=PREFIX,
                                           id_length=KEY_ID_LENGTH) - known
    if missing:
        raise DataKeyError(
            f"APPROVALD_DATA_KEY: waiting requests and runs are sealed under data key "
            f"{', '.join(sorted(missing))}, which this process does not have (set "
            "APPROVALD_DATA_KEY, or list the retired key in APPROVALD_DATA_OLD_KEYS)",
            key_id=sorted(missing)[0], failure="missing")


# -- telling a refusal -----------------------------------------------------------------

def key_error_in(exc: BaseException | None) -> DataKeyError | None:
    """The :class:`DataKeyError` ``exc`` is, or was raised from (its cause or context, or
    one of a group's), if any."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, DataKeyError):
            return e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend((e.__cause__, e.__context__))
    return None


class OneLineRefusals(logging.Filter):
    """A log record carrying a :class:`DataKeyError` becomes one line, its message and
    the error's, and is let through once per key and kind of failure in ``every``
    seconds; the next one says how many were held back meanwhile. Every other record
    passes as it is. (Each part of ``serve`` that meets a value it cannot open logs it,
    and meets it again at its next turn: a poll every two seconds, the outbox drain, an
    expiry job.)"""

    def __init__(self, every: float = TELL_EVERY,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every = every
        self._monotonic = monotonic
        self._told: dict[tuple[str, str], tuple[float, int]] = {}  # -> (when, held back)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = key_error_in(record.exc_info[1] if record.exc_info else None)
        if exc is None:
            return True
        now = self._monotonic()
        which = (exc.failure, exc.key_id)
        told = self._told.get(which)
        if told is not None and now - told[0] < self.every:
            self._told[which] = (told[0], told[1] + 1)
            return False
        held = told[1] if told is not None else 0
        self._told[which] = (now, 0)
        more = (f" ({held} more like it in the last {now - told[0]:.0f} s)"
                if told is not None and held else "")
        record.msg, record.args = f"{record.getMessage()}: {exc}{more}", None
        record.exc_info, record.exc_text = None, None
        return True
