"""Wake-ups between processes that share one PostgreSQL database (LISTEN/NOTIFY).

Each process already wakes its own worker, outbox drain and scheduler when it commits
something they should act on. With several replicas the process that committed is not
always the one free to act (its worker slots are full, it is a CLI process, or another
replica should schedule the expiry of a request it just opened). :class:`Wakeups`
forwards those wake-ups to every other process through PostgreSQL's ``NOTIFY``, so some
replica acts within milliseconds. Nothing rests on it: a lost notification (a dropped
listener connection, a restart) costs one poll interval, never a missed or repeated
effect, because every piece of work is still claimed by compare-and-set in the database.

The listening connection, held open anyway, also settles which replica leads the
periodic work every replica does (polls for ready runs, due outbox rows, run threads
behind) and the fleet's work (the run threads): with ``on_lead`` (``serve`` sets it when
its loops run: only such a process may lead them), the listener takes a session lock
(``pg_try_advisory_lock``) on it, and the one replica that holds it leads; the others try
again every ``lead_retry`` seconds. The lock goes with its connection, so a replica that
dies or loses its connection hands the lead on within ``lead_retry``; a replica that
cannot tell (not connected) leads, as every replica did before (issue 50).

A notification is sent after the commit that made the work visible (callers publish from
their after-commit hooks), carries ``origin|kind|key``, and is ignored by the process that
sent it. On SQLite there is nothing to do: :meth:`Wakeups.start` returns False.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from approvald.store.db import Database

log = logging.getLogger("approvald.wakeups")

CHANNEL = "approvald"
LEAD_LOCK = 0x61707072_6C656164  # the advisory lock's key: "apprlead"
LEAD_RETRY = 5.0  # seconds between a follower's tries to take the lead
BATCH = 200  # notifications sent in one round trip
RETRY = (1.0, 30.0)  # first and longest pause before reconnecting


class Wakeups:
    def __init__(self, db: Database, *, origin: str,
                 on_signal: Callable[[str, str], None],
                 on_lead: Callable[[bool], None] | None = None,
                 lead_retry: float = LEAD_RETRY) -> None:
        self.db = db
        self.origin = origin.replace("|", "/")
        self.on_signal = on_signal
        # told True when this process leads (or cannot tell), False while another does;
        # None: this process does no periodic work, and never takes the lead (a CLI's)
        self.on_lead = on_lead
        self.lead_retry = lead_retry
        self.leading = True
        self.received = 0  # notifications from other processes, handed to ``on_signal``
        self.sent = 0
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._relaying = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listening = asyncio.Event()

    # -- the two sides -------------------------------------------------------------------
    def publish(self, kind: str, key: str = "") -> None:
        """Tell the other processes (never blocks; a no-op while relaying theirs)."""
        if self._relaying or not self._tasks:
            return
        self._queue.put_nowait(f"{self.origin}|{kind}|{key}")

    def _received(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        origin, _, rest = payload.partition("|")
        kind, _, key = rest.partition("|")
        if origin == self.origin or not kind:
            return
        self.received += 1
        self._relaying = True  # what the handler wakes here is not sent on again
        try:
            self.on_signal(kind, key)
        except Exception:
            log.exception("handling a %s signal failed", kind)
        finally:
            self._relaying = False

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> bool:
        """Listen and send in the background; False (and nothing started) on SQLite."""
        if self.db.dialect != "postgresql":
            return False
        self._tasks = [asyncio.create_task(self._listen(), name="wakeups-listen"),
                       asyncio.create_task(self._send(), name="wakeups-send")]
        return True

    async def listening(self) -> None:
        """Wait until the listener is connected and knows whether this process leads
        (wrap it in ``asyncio.timeout``)."""
        await self._listening.wait()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _connect(self) -> Any:
        import asyncpg  # type: ignore[import-untyped]

        dsn = self.db.url.set(drivername="postgresql").render_as_string(hide_password=False)
        return await asyncpg.connect(dsn)

    async def _listen(self) -> None:
        pause = RETRY[0]
        while True:
            conn = None
            try:
                conn = await self._connect()
                await conn.add_listener(CHANNEL, self._received)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, done=closed: done.set())
                held = await self._try_lead(conn)
                self._listening.set()  # (and the lead settled, for now)
                pause = RETRY[0]
                while not held and not closed.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.lead_retry):
                            await closed.wait()
                    held = closed.is_set() or await self._try_lead(conn)
                await closed.wait()
                log.warning("wakeups: the listening connection closed; reconnecting "
                            "(polling covers the gap)")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("wakeups: cannot listen (%s: %s); retrying in %.0f s",
                            type(exc).__name__, exc, pause)
            finally:
                self._listening.clear()
                self._lead(True)  # cannot tell: poll at the given rate
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY[1])

    async def _try_lead(self, conn: Any) -> bool:
        """Take the lead on ``conn`` if nobody holds it (held, it stays held as long as
        ``conn``); whether this process leads. True at once without ``on_lead``."""
        if self.on_lead is None:
            return True
        held = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEAD_LOCK))
        self._lead(held)
        return held

    def _lead(self, leading: bool) -> None:
        if self.on_lead is not None and leading != self.leading:
            log.info("wakeups: this process %s the periodic work",
                     "leads" if leading else "follows another replica in")
            self.leading = leading
            self.on_lead(leading)

    async def _send(self) -> None:
        pause = RETRY[0]
        conn = None
        try:
            while True:
                first = await self._queue.get()
                batch = list(dict.fromkeys([first, *self._drain(BATCH - 1)]))
                try:
                    if conn is None or conn.is_closed():
                        conn = await self._connect()
                        # a lost wake-up costs a poll, never an effect: its commit need
                        # not wait for the disk
                        await conn.execute("SET synchronous_commit TO off")
                    await conn.execute(f"SELECT pg_notify('{CHANNEL}', p) "
                                       "FROM unnest($1::text[]) AS p", batch)
                    self.sent += len(batch)
                    pause = RETRY[0]
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # dropped: the others will poll, nothing is lost
                    log.warning("wakeups: cannot notify (%s: %s); %d wake-up(s) left to "
                                "polling", type(exc).__name__, exc, len(batch))
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            await conn.close(timeout=2)
                    conn = None
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY[1])
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)

    def _drain(self, n: int) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            try:
                out.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return out
