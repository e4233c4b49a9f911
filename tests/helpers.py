"""Running the real ``approvald`` command: in this process (``InProcessCli``: the same
``main`` the console script calls, with the command's environment and working directory
for the length of the call) or in a subprocess (``Cli``: for a process that must die, a
failpoint's SIGKILL, or one that must outlive the call, ``serve``): a process forked from
a warm server (tests/zygote.py). A test that signals a ``serve``, ``sandbox`` or
``mcp-proxy`` starts it with :func:`popen_approvald` or :func:`start_approvald`, whose
``send_signal``, ``terminate`` and ``kill`` reach the command's own process.

From a coroutine, ``await cli.acall(...)``: the calling loop runs on while the command
does (a ``serve`` on that loop may hold a lock the command waits for: blocking the loop
would wait forever). ``cli(...)`` refuses to run in a thread whose event loop is running."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.zygote import PID_FD, Warm

APPROVALD = str(Path(sys.executable).parent / "approvald")

# the subprocess ``approvald``: a process forked from this test process's warm server
# (tests/zygote.py), which has done the console script's ~670 imports once, not a cold
# interpreter that does them again (0.6-1 s of CPU each)
WARM = Warm()


def warm_approvald() -> str:
    """The warm ``approvald`` (its shim), its server started on first use with the
    environment a subprocess of this process gets, less ``APPROVALD_*`` and ``SLACK_*``
    (the server's imports read none of it; each command gets its own)."""
    WARM.start({k: v for k, v in os.environ.items()
                if not k.startswith(("APPROVALD_", "SLACK_"))})
    return WARM.approvald


# the MCP gateway tests' fixture server (tests/fixtures/mcp_server.py), warm in the same
# way: the MCP SDK's server imports (0.7 s of CPU) done once, the script run in each child
MCP_SERVER = Path(__file__).resolve().parent / "fixtures" / "mcp_server.py"
WARM_MCP_SERVER = Warm(MCP_SERVER)


def warm_mcp_server() -> list[str]:
    """The command that runs the fixture server as ``[sys.executable, MCP_SERVER]`` would."""
    WARM_MCP_SERVER.start({k: v for k, v in os.environ.items()
                           if not k.startswith(("APPROVALD_", "SLACK_", "MCP_FIXTURE"))})
    return [WARM_MCP_SERVER.approvald]


def _read_pid(read: int, args: tuple[str, ...] | list[str]) -> int:
    """The pid the shim wrote to descriptor ``read`` (its command's own), closing it."""
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = os.read(read, 64)
            if not chunk:
                raise AssertionError(f"the warm approvald {' '.join(args[:2])} did not start")
            data += chunk
    finally:
        os.close(read)
    return int(data)


class WarmPopen(subprocess.Popen[str]):
    """A warm ``approvald`` (:func:`popen_approvald`): what ``wait`` and ``returncode`` tell
    is the command's exit (its shim exits as it did, once the command is reaped), and a
    signal sent goes to the command's own process (:attr:`child_pid`), as to a cold one."""

    child_pid: int

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # the shim runs: its command is not yet reaped
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child_pid, sig)


def popen_approvald(args: list[str], **kwargs: Any) -> WarmPopen:
    """``subprocess.Popen([approvald, *args], **kwargs)``, the warm ``approvald``."""
    read, write = os.pipe()
    env = {**(kwargs.pop("env", None) or os.environ), PID_FD: str(write)}
    try:
        proc = WarmPopen([warm_approvald(), *args], env=env, pass_fds=(write,), **kwargs)
    finally:
        os.close(write)
    proc.child_pid = _read_pid(read, args)
    return proc


class WarmProcess(asyncio.subprocess.Process):
    """:class:`WarmPopen`'s asyncio twin (:func:`start_approvald`)."""

    child_pid: int
    log: Path | None = None  # where its standard error goes, when a file (start_serve)

    def send_signal(self, signal: int) -> None:
        if self.returncode is None:  # the shim runs: its command is not yet reaped
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child_pid, signal)

    def terminate(self) -> None:
        self.send_signal(15)  # SIGTERM

    def kill(self) -> None:
        self.send_signal(9)  # SIGKILL


async def start_approvald(*args: str, env: Mapping[str, str], cwd: Path | str,
                          **kwargs: Any) -> WarmProcess:
    """``asyncio.create_subprocess_exec(approvald, *args, env=env, cwd=cwd, **kwargs)``, the
    warm ``approvald``."""
    loop = asyncio.get_running_loop()
    read, write = os.pipe()
    try:
        transport, protocol = await loop.subprocess_exec(
            lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=2**16, loop=loop),
            warm_approvald(), *args, env={**env, PID_FD: str(write)}, cwd=cwd,
            pass_fds=(write,), **kwargs)
    finally:
        os.close(write)
    proc = WarmProcess(transport, protocol, loop)
    proc.child_pid = _read_pid(read, args)
    return proc


@dataclass
class Cli:
    """An ``approvald`` bound to one database, demo ledger and clock file."""

    db_url: str
    workdir: Path
    env_extra: dict[str, str] = field(default_factory=dict)

    @property
    def ledger(self) -> Path:
        return self.workdir / "ledger.jsonl"

    @property
    def clock_file(self) -> Path:
        return self.workdir / "clock"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("APPROVALD_", "SLACK_"))}
        env.update(APPROVALD_DATABASE_URL=self.db_url, APPROVALD_DEMO_LEDGER=str(self.ledger),
                   APPROVALD_CLOCK_FILE=str(self.clock_file), APPROVALD_LOG_LEVEL="WARNING",
                   APPROVALD_METRICS_ADDR="127.0.0.1:0")
        env.update(self.env_extra)
        env.update(extra)
        return env

    def __call__(self, *args: str, failpoints: str | None = None, timeout: float = 60,
                 **extra: str) -> subprocess.CompletedProcess[str]:
        not_in_a_running_loop(args)
        env = self.env(**extra)
        if failpoints:
            env["APPROVALD_FAILPOINTS"] = failpoints
        return subprocess.run([self.executable(args), *args], env=env, cwd=self.workdir,
                              text=True, capture_output=True, timeout=timeout, check=False)

    async def acall(self, *args: str, failpoints: str | None = None,
                    timeout: float = 60,  # noqa: ASYNC109 (subprocess.run's, as __call__)
                    **extra: str) -> subprocess.CompletedProcess[str]:
        """``self(*args)`` awaited: the subprocess runs while this loop runs on."""
        env = self.env(**extra)
        if failpoints:
            env["APPROVALD_FAILPOINTS"] = failpoints
        return await run_subprocess([warm_approvald(), *args], env=env, cwd=self.workdir,
                                    timeout=timeout)

    def spawn(self, *args: str, **extra: str) -> WarmPopen:
        return popen_approvald(list(args), env=self.env(**extra), cwd=self.workdir, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    @staticmethod
    def executable(args: tuple[str, ...]) -> str:
        """The warm ``approvald`` (:func:`warm_approvald`), for every command: one a test
        signals is started by :func:`popen_approvald` (:meth:`spawn`), whose signals reach
        the command itself."""
        return warm_approvald()

    def json(self, *args: str) -> Any:
        done = self(*args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def ok(self, *args: str, code: int = 0) -> str:
        done = self(*args)
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return done.stdout

    async def ajson(self, *args: str) -> Any:
        done = await self.acall(*args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    async def aok(self, *args: str, code: int = 0) -> str:
        done = await self.acall(*args)
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return done.stdout

    def ledger_lines(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(x) for x in self.ledger.read_text().splitlines() if x.strip()]

    def set_time(self, when: datetime) -> None:
        """Move the processes' clock: the file replaced whole, never truncated and then
        written (a process reading between the two found it empty: a ConfigError that
        failed its run's step, whose backoff then waited on a clock no longer moving)."""
        tmp = self.clock_file.with_name(self.clock_file.name + ".tmp")
        tmp.write_text(when.isoformat())
        os.replace(tmp, self.clock_file)

    def advance_time(self, delta: timedelta) -> datetime:
        now = datetime.fromisoformat(self.clock_file.read_text().strip())
        self.set_time(now + delta)
        return now + delta


# commands that own their process (signal handlers, a server until SIGTERM): a subprocess
OWN_PROCESS = frozenset({"serve", "sandbox", "mcp-proxy"})


class InProcessCli(Cli):
    """The same ``approvald`` run by :func:`run_in_process`; a call whose process must die
    (``failpoints``: a SIGKILL) or that owns its process (:data:`OWN_PROCESS`) still runs
    in a subprocess, and ``spawn`` starts one."""

    def __call__(self, *args: str, failpoints: str | None = None, timeout: float = 60,
                 **extra: str) -> subprocess.CompletedProcess[str]:
        if failpoints or (args and args[0] in OWN_PROCESS):
            return super().__call__(*args, failpoints=failpoints, timeout=timeout, **extra)
        not_in_a_running_loop(args)
        return run_in_process(list(args), env=self.env(**extra), cwd=self.workdir)

    async def acall(self, *args: str, failpoints: str | None = None,
                    timeout: float = 60,  # noqa: ASYNC109 (subprocess.run's, as __call__)
                    **extra: str) -> subprocess.CompletedProcess[str]:
        """``self(*args)`` awaited: the command runs in a thread while this loop runs on
        (what the loop's tasks print meanwhile is not the command's output)."""
        if failpoints or (args and args[0] in OWN_PROCESS):
            return await super().acall(*args, failpoints=failpoints, timeout=timeout,
                                       **extra)
        return await asyncio.to_thread(run_in_process, list(args), env=self.env(**extra),
                                       cwd=self.workdir)


def not_in_a_running_loop(args: tuple[str, ...]) -> None:
    """Refuse a blocking call from a thread whose event loop runs: the loop would stand
    still for the whole command, and a task of it holding a lock the command needs (a
    ``serve`` mid-transaction) would never let go of it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise AssertionError(f"approvald {' '.join(args[:2])}: called from a running event loop, "
                         "which it would block for the whole command; "
                         "use `await cli.acall(...)`")


async def run_subprocess(argv: list[str], *, env: Mapping[str, str], cwd: Path,
                         timeout: float = 60,  # noqa: ASYNC109 (as subprocess.run's)
                         input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`` awaited:
    the loop runs on meanwhile; past ``timeout`` the process is killed and
    ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=dict(env), cwd=cwd, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL)
    data = input.encode() if input is not None else None
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode or 0, _text(out), _text(err))


def _text(data: bytes) -> str:
    # as text=True reads it: the locale's encoding, universal newlines
    return io.TextIOWrapper(io.BytesIO(data)).read()


_ONE_AT_A_TIME = threading.Lock()  # the environment and cwd are global: one command at once
# whose stdout and stderr the code running in this context writes to: a command's own
_CAPTURED: contextvars.ContextVar[tuple[io.StringIO, io.StringIO] | None] = \
    contextvars.ContextVar("approvald_captured", default=None)


class _OwnStream:
    """``sys.stdout`` or ``sys.stderr`` while a command runs in process: what the command
    (its thread, its loop's tasks and the threads they start with their context) writes
    goes to its own buffer; what anything else writes meanwhile (the test's loop, running
    on while the command does) goes where it went before."""

    def __init__(self, index: int, before: Any) -> None:
        self._index, self._before = index, before

    def _target(self) -> Any:
        captured = _CAPTURED.get()
        return self._before if captured is None else captured[self._index]

    def write(self, text: str) -> int:
        return int(self._target().write(text))

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


@contextlib.contextmanager
def own_streams() -> Iterator[None]:
    """``sys.stdout``/``sys.stderr`` dispatching by :data:`_CAPTURED` inside, and exactly
    what they were again after."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _OwnStream(0, out), _OwnStream(1, err)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def run_in_process(argv: list[str], *, env: Mapping[str, str], cwd: Path
                   ) -> subprocess.CompletedProcess[str]:
    """``approvald ARGV`` run by :func:`approvald.bot.cli.main` in this process, as a
    subprocess with environment ``env`` in directory ``cwd`` would run it: (exit code,
    stdout, stderr) come back as a ``CompletedProcess``. The command runs in a thread of
    its own (it runs its own event loop); the environment, the working directory,
    ``sys.path`` and the modules the command imported from ``cwd`` (its
    ``APPROVALD_AGENTS``) are put back afterwards. Its stdout and stderr are its own
    (:class:`_OwnStream`): what other threads print meanwhile is not captured (a test's
    loop keeps running while :meth:`InProcessCli.acall` waits)."""
    from approvald.bot.cli import main

    not_in_a_running_loop(tuple(argv))
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []
    failure: list[BaseException] = []

    def command() -> None:
        try:
            codes.append(main(argv))
        except BaseException as exc:  # e.g. a failpoint's in-process Crash
            failure.append(exc)

    context = contextvars.copy_context()
    context.run(_CAPTURED.set, (out, err))
    with _ONE_AT_A_TIME, scoped_environ(env), contextlib.chdir(cwd), \
            scoped_imports(cwd, env.get("APPROVALD_AGENTS", "")), own_streams():
        thread = threading.Thread(target=context.run, args=(command,),
                                  name=f"approvald {' '.join(argv[:2])}")
        thread.start()
        thread.join()
    if failure:
        raise failure[0]
    return subprocess.CompletedProcess([APPROVALD, *argv], codes[0], out.getvalue(),
                                       err.getvalue())


@contextlib.contextmanager
def scoped_environ(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` is exactly ``env`` inside, and exactly what it was again after."""
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextlib.contextmanager
def scoped_imports(cwd: Path, agents: str) -> Iterator[None]:
    """The agent modules (``agents``, as ``APPROVALD_AGENTS`` names them) imported afresh,
    as a new process would (they read the environment when imported), and afterwards
    ``sys.path`` as it was and no module imported from ``cwd`` or named in ``agents`` left
    cached."""
    names = {n.strip() for n in agents.split(",") if n.strip()}
    below = tuple(f"{n}." for n in names)
    ours = {n: m for n, m in sys.modules.items() if n in names or n.startswith(below)}
    for name in ours:
        del sys.modules[name]
    path, modules = list(sys.path), set(sys.modules)
    try:
        yield
    finally:
        sys.path[:] = path
        root = str(cwd.resolve())
        for name in set(sys.modules) - modules:
            where = getattr(sys.modules[name], "__file__", None) or ""
            if where.startswith(root) or name in names or name.startswith(below):
                del sys.modules[name]
        sys.modules.update(ours)


START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def make_cli(db_url: str, tmp_path: Path, *, in_process: bool = False) -> Cli:
    """An ``approvald`` on ``db_url`` working in ``tmp_path``, its clock at :data:`START`:
    run in this process (``in_process``) or in a subprocess for each command."""
    cli = (InProcessCli if in_process else Cli)(db_url=db_url, workdir=tmp_path)
    cli.set_time(START)
    return cli



@contextlib.contextmanager
def through_sqlalchemy(db: Any, *tables: str) -> Iterator[list[str]]:
    """The statements naming one of ``tables`` that SQLAlchemy itself executes on ``db``
    meanwhile (a plan's, ``store/fastsql.py``, never show here)."""
    from sqlalchemy import event

    through: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if any(f" {t} " in f"{statement} ".replace("\n", " ") for t in tables):
            through.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        yield through
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)

@contextlib.contextmanager
def executed_on(*tables: str) -> Iterator[list[str]]:
    """The statements naming one of ``tables`` that the store's repositories execute
    meanwhile, whichever way each runs: by its plan (``store/fastsql.py``) or through
    SQLAlchemy (where :func:`through_sqlalchemy` sees only the second)."""
    from approvald.store import fastsql

    executed: list[str] = []
    real = fastsql.Conn.execute

    async def execute(self: Any, stmt: Any, params: Any = None) -> Any:
        statement = str(stmt)
        if any(f" {t} " in f"{statement} ".replace("\n", " ") for t in tables):
            executed.append(statement)
        return await real(self, stmt, params)

    fastsql.Conn.execute = execute  # type: ignore[method-assign]
    try:
        yield executed
    finally:
        fastsql.Conn.execute = real  # type: ignore[method-assign]


def free_port() -> int:
    """A port on 127.0.0.1 free now, for a server a test starts as a process of its own,
    chosen outside the kernel's ephemeral range: a port ``bind(0)`` hands out is one the
    next outgoing connection (to PostgreSQL, to the emulator, another worker's) may take in
    the seconds before that process binds it (CI: a replica's serve exited with "Address
    already in use"). Below that range nothing is handed out unasked."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    ports = random.sample(range(10_000, low), min(200, low - 10_000)) if low > 11_000 else []
    for port in [*ports, 0]:  # (0: no range below the ephemeral one to pick from)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise AssertionError("no free port")  # (bind(0) failed too)


class Crash(BaseException):
    """The process dies at a failpoint (in-process tests cannot SIGKILL themselves); a
    BaseException, so nothing on the way swallows it."""


def crash(name: str) -> None:
    """A failpoint action: die here (``failpoints.arm(name, crash)``)."""
    raise Crash(name)


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A TCP server that accepts every connection, reads what it is sent and never
    answers (a stalled PostgreSQL, a serve that hangs). Yields its port."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up; never a byte back
        writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        async with server:
            await server.serve_forever()

    task: list[asyncio.Task[None]] = []
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(_keep(task, loop.create_task(serve()))),
        daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield port[0]
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(10)
        loop.close()


async def _keep(box: list[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    box.append(task)
    try:
        await task
    except asyncio.CancelledError:
        pass


def ci_architecture() -> Any:
    """``.ci/architecture.py`` loaded as a module (it is a script, not a package): the
    counts the layout and layer tests hold to zero, and the names they point at."""
    return ci_script("architecture")


def ci_script(name: str) -> Any:
    """The script ``.ci/<name>.py`` loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[1] / ".ci" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def opened_by_faces(monkeypatch: Any, db: Any) -> list[str]:
    """The reads and writes opened on ``db`` from now on, each as ``kind:module`` of the
    code that opened it; the expiry scheduler's own timer (which may fire meanwhile) is
    left out."""
    opened: list[str] = []

    def counting(kind: str) -> Any:
        real = getattr(db, kind)

        def open_(*args: Any, **kwargs: Any) -> Any:
            where = Path(sys._getframe(1).f_code.co_filename)
            if where.name != "scheduler.py":
                opened.append(f"{kind}:{where.parent.name}/{where.stem}")
            return real(*args, **kwargs)
        return open_

    for kind in ("read", "write", "transact"):
        monkeypatch.setattr(db, kind, counting(kind))
    return opened
class Taken:
    """A face that takes every outbox row as delivered (tests that read the outbox)."""

    async def deliver(self, row: Any) -> dict[str, Any] | None:
        return None


async def follow_up(engine: Any) -> int:
    """Drain ``engine``'s outbox once, as ``serve`` does after a commit: the runtime's own
    rows are followed up (a caller's request decided: its webhook queued, its run ended)
    and every face's row is taken as delivered. How many rows went."""
    return int(await engine.drain(Taken()).drain_once())


def parts(engine: Any) -> Any:
    """The engine's parts (``runtime.engine.Parts``: its database, clock, audit trail,
    registry, deciders...), which it keeps private: the tests' one door to them (issue 47).
    A test calls the engine's verbs and reads its views where they say what it needs, reads
    and forges rows through :class:`Rows`, and comes through here only for what no verb
    gives (a manual clock to move, a part to build a collaborator from, a part to spy on).
    ``tests/unit/test_parts.py`` holds every other test module to it: none reads
    ``engine._parts`` or another private attribute of the engine itself."""
    return engine._parts


async def create_token(engine: Any, keys: Any, name: str, **kw: Any) -> Any:
    """An API token made as ``approvald token create`` makes one
    (:func:`runtime.requests.api_tokens.create` over the engine's database, clock and audit trail);
    keywords as that function's."""
    from approvald.runtime.requests import api_tokens

    p = parts(engine)
    return await api_tokens.create(p.db, p.clock, keys, p.audit, name, **kw)


async def revoke_token(engine: Any, name: str, **kw: Any) -> Any:
    """Token ``name`` revoked as ``approvald token revoke`` revokes it
    (:func:`runtime.requests.api_tokens.revoke`)."""
    from approvald.runtime.requests import api_tokens

    p = parts(engine)
    return await api_tokens.revoke(p.db, p.clock, p.audit, name, **kw)


def padded(ids: Any, least: int = 16) -> list[Any]:
    """``ids`` sorted, each once, the last repeated up to ``least`` or the next power of
    two: a list for an ``IN`` that makes one statement text of lists of like lengths
    (PostgreSQL prepares each new text, a round trip of its own; the model-based test's
    reads after every step met a new length at almost every step). The rows are those of
    ``ids``."""
    unique = sorted(set(ids))
    if not unique:
        return []
    size = max(least, 1 << (len(unique) - 1).bit_length())
    return unique + unique[-1:] * (size - len(unique))


@functools.cache
def _of_ids(column: Any, size: int, order: Any = None) -> Any:
    """``SELECT`` of ``column``'s table where ``column IN (:id0, ..., :id<size-1>)``
    (ordered by ``order``), built once a size and run by its plan (``store/fastsql.py``):
    the SQL an expanded ``IN`` of ``size`` values says, without SQLAlchemy's machinery
    around each statement (building it, its cache key, expanding the list, its result),
    which was most of the CPU of the model-based test's reads after every step."""
    from approvald.store import fastsql
    from sqlalchemy import bindparam, select

    stmt = select(column.table).where(
        column.in_([bindparam(f"id{i}", type_=column.type) for i in range(size)]))
    return fastsql.fast(stmt if order is None else stmt.order_by(order))


async def _rows_in(conn: Any, column: Any, ids: Any, order: Any = None) -> Any:
    """The rows of ``column``'s table whose ``column`` is one of ``ids`` (see ``padded``)."""
    values = padded(ids)
    return await conn.execute(_of_ids(column, len(values), order),
                              {f"id{i}": v for i, v in enumerate(values)})


async def approvals_of(tx: Any, run_ids: Any) -> list[Any]:
    """What ``tx.approvals.for_run`` gives for each of ``run_ids`` in turn, in one
    statement rather than one a run (the model-based test reads every request after every
    step: on PostgreSQL each statement is a round trip to another process)."""
    from approvald.store.models import Approval
    from approvald.store.records import ApprovalRecord

    ids = list(run_ids)
    if not ids:
        return []
    table = Approval.__table__
    rows = await _rows_in(tx.approvals.conn, table.c.run_id, ids, table.c.requested_at)
    by_run: dict[str, list[Any]] = {}
    for r in rows:
        by_run.setdefault(r.run_id, []).append(ApprovalRecord(**r._mapping))
    return [a for run_id in ids for a in by_run.get(run_id, [])]


async def executions_of(tx: Any, run_ids: Any) -> dict[tuple[str, str], Any]:
    """The ledger rows of ``run_ids``' calls by (run id, call id), in one statement (as
    ``tx.executions.for_run`` gives them a run at a time)."""
    from approvald.store.models import ToolExecution
    from approvald.store.records import ExecutionRecord

    ids = list(run_ids)
    if not ids:
        return {}
    table = ToolExecution.__table__
    rows = await _rows_in(tx.executions.conn, table.c.run_id, ids)
    return {(r.run_id, r.call_id): ExecutionRecord(**r._mapping) for r in rows}


async def runs_of(tx: Any, run_ids: Any) -> dict[str, Any]:
    """The runs ``run_ids`` that exist, by id, in one statement (``tx.runs.get`` each)."""
    from approvald.store.models import Run
    from approvald.store.records import RunRecord

    ids = list(run_ids)
    if not ids:
        return {}
    table = Run.__table__
    rows = await _rows_in(tx.runs.conn, table.c.id, ids)
    return {r.id: RunRecord(**r._mapping) for r in rows}


class Rows:
    """The tests' one way into the database: the rows a test reads to assert on, and the
    rows a tampering test forges past the runtime (an attacker with write access and not
    the key). A test that needs another read adds it here, not a ``db.read()`` of its
    own (issue 47); the layout test holds the files that still open one to a count."""

    def __init__(self, db: Any) -> None:
        self.db = db

    @classmethod
    def of(cls, engine: Any) -> Rows:
        return cls(parts(engine).db)

    async def approval(self, approval_id: str) -> Any:
        async with self.db.read() as tx:
            return await tx.approvals.get(approval_id)

    async def approvals(self, *run_ids: str) -> list[Any]:
        """The approvals of ``run_ids``, run by run, each run's in the order made."""
        async with self.db.read() as tx:
            return await approvals_of(tx, run_ids)

    async def run(self, run_id: str) -> Any:
        async with self.db.read() as tx:
            return await tx.runs.get(run_id)

    async def execution(self, run_id: str, call_id: str) -> Any:
        """The ledger's row of a call (None: no intent was written)."""
        async with self.db.read() as tx:
            return await tx.executions.get(run_id, call_id)

    async def requests(self, *, status: str | None = None, limit: int = 100) -> list[Any]:
        """The latest requests (approvals) of every run, newest first; of one status."""
        async with self.db.read() as tx:
            return await tx.approvals.recent(status=status, limit=limit)

    async def votes(self, approval_id: str) -> list[Any]:
        """The votes cast on a request, each with its actor and the digest it was cast on."""
        async with self.db.read() as tx:
            return await tx.approvals.votes(approval_id)

    async def runs(self, *, limit: int = 50) -> list[Any]:
        """The latest runs, newest first."""
        async with self.db.read() as tx:
            return await tx.runs.recent(limit=limit)

    async def events(self, run_id: str) -> list[Any]:
        """A run's transcript, in order."""
        async with self.db.read() as tx:
            return await tx.events.load(run_id)

    async def thread(self, run_id: str) -> Any:
        """A run's Slack thread: where it is posted and how far (None: not yet)."""
        async with self.db.read() as tx:
            return await tx.threads.get(run_id)

    async def thread_and_run(self, run_id: str) -> tuple[Any, Any]:
        """A run's thread and the run, read together (one snapshot: whether the thread has
        caught up with the run, while the worker and the follower move both)."""
        async with self.db.read() as tx:
            return await tx.threads.get(run_id), await tx.runs.get(run_id)

    async def request_state(self, approval_id: str) -> tuple[str, list[Any], tuple[int, str]]:
        """A request's status, its votes and the audit chain's head, read together: what a
        refused click must leave exactly as it was."""
        async with self.db.read() as tx:
            a = await tx.approvals.get(approval_id)
            return a.status, await tx.approvals.votes(approval_id), await tx.audit.head()

    async def executions(self, run_id: str) -> dict[str, Any]:
        """The ledger's rows of a run, by call id."""
        async with self.db.read() as tx:
            return await tx.executions.for_run(run_id)

    async def external(self, request_id: str) -> Any:
        """A caller's request as the HTTP API, the MCP gateway or a hook opened it."""
        async with self.db.read() as tx:
            return await tx.external.get(request_id)

    async def outbox(self, kind: str | None = None) -> list[Any]:
        """The outbox's rows, oldest first (of one kind)."""
        async with self.db.read() as tx:
            return list(await tx.outbox.recent(kind=kind))

    async def outbox_row(self, row_id: int) -> Any:
        async with self.db.read() as tx:
            return await tx.outbox.get(row_id)

    async def audit(self, *, approval_id: str | None = None,
                    run_id: str | None = None) -> list[Any]:
        async with self.db.read() as tx:
            return list(await tx.audit.query(approval_id=approval_id, run_id=run_id))

    async def approvals_matching(self, match: Any) -> tuple[list[Any], int]:
        """The requests ``match`` (a ``store.repos.approvals.Match``) finds, oldest first,
        and how many it counts."""
        async with self.db.read() as tx:
            return (await tx.approvals.oldest(match=match, limit=1000),
                    await tx.approvals.count(match=match))

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``: what the statement counts depend on."""
        return str(self.db.dialect)

    async def started_by(self, owner: str) -> str | None:
        """The run whose call ``owner`` (a ledger's owner) started, if any."""
        async with self.db.read() as tx:
            return await tx.executions.started_by(owner)

    async def token(self, secret: str) -> Any:
        """The live API token ``secret`` is (None: unknown, malformed or revoked), as
        :func:`runtime.requests.api_tokens.authenticate` reads it."""
        from approvald.runtime.requests import api_tokens

        return await api_tokens.authenticate(self.db, secret)

    async def token_from_header(self, authorization: str) -> Any:
        """The live API token an ``Authorization: Bearer ...`` header carries, or None."""
        from approvald.runtime.requests import api_tokens

        return await api_tokens.from_header(self.db, authorization)

    async def sign_in_link(self, link_hash: str) -> Any:
        """A web review sign-in link's row, by its hash."""
        async with self.db.read() as tx:
            return await tx.web.link_by_hash(link_hash)

    async def audit_and_refusal_counts(self) -> tuple[list[Any], list[Any]]:
        """The audit entries and the web review queue's refusal counts not yet folded into
        one, read together (one snapshot: a count folded meanwhile is in one of them)."""
        async with self.db.read() as tx:
            return list(await tx.audit.query()), list(await tx.web.refusal_counts())

    async def verify_audit(self, **kw: Any) -> Any:
        """The audit chain's verifier's report (:func:`runtime.record.audit.verify`;
        keywords as that function's)."""
        from approvald.runtime.record import audit

        return await audit.verify(self.db, **kw)

    async def audit_export(self, **kw: Any) -> str:
        """The audit log as ``approvald audit export`` writes it (keywords as
        :func:`runtime.record.audit.export`'s)."""
        from approvald.runtime.record import audit

        return "".join([line async for line in audit.export(self.db, **kw)])

    async def select(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        """Rows as they are stored, by SQL (what no repository reads: a raw column)."""
        from sqlalchemy import text

        async with self.db.read() as tx:
            return [tuple(r) for r in await tx.conn.execute(text(sql), params)]

    async def count(self, table: str) -> int:
        """How many rows ``table`` holds."""
        [(n,)] = await self.select(f"SELECT count(*) FROM {table}")
        return int(n)

    async def execute(self, sql: str, **params: Any) -> None:
        """Change rows behind the runtime's back, by SQL, in a transaction of its own."""
        from sqlalchemy import text

        async with self.db.write() as tx:
            await tx.conn.execute(text(sql), params)

    async def record_intent(self, **kw: Any) -> bool:
        """A call's intent in the ledger, as a worker writes it before the call (one that
        then dies leaves the outcome unknown)."""
        async with self.db.write() as tx:
            return bool(await tx.executions.record_intent(**kw))

    async def record_result(self, **kw: Any) -> bool:
        """A call's result in the ledger, as a worker writes it after the call."""
        async with self.db.write() as tx:
            return bool(await tx.executions.record_result(**kw))

    async def in_one_read(self, reads: Any, *, snapshot: bool = False) -> Any:
        """``reads(tx)`` inside one read transaction: for a test of what a repository's
        statements return together (the same rows read two ways, side by side);
        ``snapshot``: every statement sees the same committed state (as ``audit verify``
        reads the chain and the tables it checks against it)."""
        async with self.db.read(snapshot=snapshot) as tx:
            return await reads(tx)

    async def on_a_connection(self, reads: Any) -> Any:
        """``reads(conn)`` on a SQLAlchemy connection of its own, in the one transaction
        SQLAlchemy begins on it (on PostgreSQL at READ COMMITTED: each statement sees the
        latest commit; on SQLite one snapshot), rolled back after: statements of the test's
        own, read as they are stored, at the cost of a plain connection (no snapshot
        isolation set up on PostgreSQL, as ``in_one_read(snapshot=True)`` does)."""
        async with self.db.connection() as conn:
            return await reads(conn)

    async def in_one_write(self, writes: Any) -> Any:
        """``writes(tx)`` inside one write transaction: a history forged through the
        repositories in one commit (many rows, as the runtime would have left them), or
        what a plain function hands the transaction (the audit trail's entries, chained
        as it commits: ``writes`` need not be a coroutine function)."""
        async with self.db.write() as tx:
            done = writes(tx)
            return await done if inspect.isawaitable(done) else done

    async def add_outbox(self, *, kind: str, group_key: str, payload: str, now: Any) -> int:
        """A row queued in the outbox, as the runtime queues one; its id."""
        async with self.db.write() as tx:
            await tx.outbox.add(kind=kind, group_key=group_key, now=now, payload=payload)
            return max(r.id for r in await tx.outbox.recent(kind=kind))

    async def redrive(self, row_ids: list[int] | None, *, now: Any, give_up_at: Any
                      ) -> list[Any]:
        """Outbox rows tried again (None: every dead row), as ``approvald outbox retry``
        does; the rows revived."""
        async with self.db.write() as tx:
            return list(await tx.outbox.redrive(row_ids, now=now, give_up_at=give_up_at))

    async def card_posted(self, approval_id: str, *, channel: str, ts: str) -> None:
        """A request's card recorded as posted at ``channel``/``ts`` (what serve records)."""
        async with self.db.write() as tx:
            await tx.approvals.set_message(approval_id, channel=channel, ts=ts)

    async def add_token(self, **values: Any) -> bool:
        """An API token's row put in by hand (as an older release made one)."""
        async with self.db.write() as tx:
            return bool(await tx.external.add_token(**values))

    async def revoke_token(self, name: str, *, by: str, now: Any) -> Any:
        """Token ``name`` revoked in its row alone (no audit entry, nothing forgotten by a
        running engine), as an older release's ``tokens revoke`` did; the revoked row."""
        async with self.db.write() as tx:
            return await tx.external.revoke_token(name, by=by, now=now)

    async def claim_runnable(self, **kw: Any) -> list[Any]:
        """The runs a worker would claim now (keywords as ``tx.runs.claim_runnable``'s)."""
        async with self.db.write() as tx:
            return list(await tx.runs.claim_runnable(**kw))

    async def update_run(self, run_id: str, **values: Any) -> None:
        """A run's row changed as the runtime changes it (another worker's lease...)."""
        async with self.db.write() as tx:
            await tx.runs.update(run_id, **values)

    async def insert(self, table: Any, rows: list[dict[str, Any]]) -> None:
        """Put rows in behind the runtime's back: ``INSERT INTO table`` (a state no path
        of this release makes, or one made faster than through the runtime)."""
        async with self.db.write() as tx:
            await tx.conn.execute(table.insert(), rows)

    async def forge(self, table: Any, *where: Any, **values: Any) -> None:
        """Change rows behind the runtime's back: ``UPDATE table SET values WHERE where``."""
        from sqlalchemy import update

        async with self.db.write() as tx:
            await tx.conn.execute(update(table).where(*where).values(**values))

    async def remove(self, table: Any, *where: Any) -> None:
        """Delete rows behind the runtime's back: ``DELETE FROM table WHERE where``."""
        from sqlalchemy import delete

        async with self.db.write() as tx:
            await tx.conn.execute(delete(table).where(*where))

    async def value(self, column: Any, *where: Any) -> Any:
        """One column of one row, read as it is stored (``SELECT column WHERE where``)."""
        from sqlalchemy import select

        async with self.db.read() as tx:
            return (await tx.conn.execute(select(column).where(*where))).scalar_one()

    async def audit_head(self) -> tuple[int, str]:
        async with self.db.read() as tx:
            return tuple(await tx.audit.head())  # type: ignore[return-value]

    @contextlib.asynccontextmanager
    async def audit_head_locked(self) -> AsyncIterator[None]:
        """A write transaction that holds the audit head (as ``serve`` does between its
        statements while it appends) until the body is done."""
        async with self.db.write() as tx:
            await tx.audit.lock_head()
            yield

    async def audit_checkpoint(self) -> Any:
        async with self.db.read() as tx:
            return await tx.audit.checkpoint()

    async def kept_requests(self) -> list[tuple[int, int, str, str, str]]:
        """The requests kept folded: (seq, folded, state, key_id, mac), in seq order."""
        async with self.db.read(snapshot=True) as tx:
            return [tuple(r) async for rows in tx.audit.folded()  # type: ignore[misc]
                    for r in rows]

    async def audit_fold(self) -> Any:
        async with self.db.read() as tx:
            return await tx.audit.fold()


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[int]:
    """An aiohttp ``app`` served on 127.0.0.1 at a free port (yielded), no access log,
    stopped on leaving."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


class Proxy:
    """A TCP forwarder to PostgreSQL that the test can cut, as a network partition or a
    stopped server would: the listener closes and every connection through it drops.
    Started again (:meth:`start`), it listens on the same port: the database is back."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        self.writers.clear()
        await self.server.wait_closed()
