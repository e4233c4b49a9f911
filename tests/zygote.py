"""A warm ``approvald``: the command line's imports done once, then a fresh process forked
from it for each command (the docs examples' commands, tests/docs/examples.py, and the
tests' subprocess ``approvald``, :class:`tests.helpers.Cli`).

Each ``approvald`` a docs page runs would import the same ~680 modules (0.7-1 s of CPU)
before doing its own work (a few hundredths of a second); a page runs up to thirty. The
examples test instead puts a small ``approvald`` (:data:`SHIM`) first on the page's
``PATH``: it hands its arguments, environment, working directory and its standard input,
output and error (the file descriptors themselves) to this server, which forks a child that
runs the console script's code (``sys.exit(main())``) in a process of its own, with that
environment, in that directory, on those descriptors; the shim exits with the child's status
(a child killed by a signal kills the shim with the same signal) and passes SIGTERM, SIGINT
and SIGHUP on to it; a shim that dies first (SIGKILL) takes the child with it (SIGKILL).
Started with :data:`PID_FD` naming a descriptor, the shim writes the child's pid to it: a
test that signals the command (:func:`tests.helpers.popen_approvald`) signals the child
itself, and the shim's exit, once the child is reaped, is the command's.
What is shared is only the imports: ``approvald.bot.cli`` (the console script's own),
every command group's module (:func:`approvald.bot.cli.root.groups`, as the reference
pages' parser imports them; a command imports its own group's as it starts) and what the
commands that serve import as they start (:data:`SERVED`). They read no
environment, but for the failpoints, which are armed again in the child from its own.

The same server runs a Python script instead (``python zygote.py SOCKET SCRIPT``: the
modules the script imports at its top imported once, the script itself run in each
child): the MCP gateway tests' fixture server, :func:`tests.helpers.warm_mcp_server`.

Run as ``python zygote.py SOCKET``; it serves until its standard input closes (its parent,
the test process, ended) or it is killed. :class:`Warm` starts one (per test process) and
makes its shim.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

MAX_MESSAGE = 1 << 20
# the environment variable naming a descriptor the shim writes its command's pid to (and
# then closes): what :func:`child_pid` reads; the command's environment does not hold it
PID_FD = "ZYGOTE_PID_FD"

# what is started as the ``approvald`` a page runs: connects, sends, relays signals, exits
# as the child did (``-S``: no site import, so it starts in milliseconds)
SHIM = """\
#!{python} -S
import json, os, signal, socket, sys
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect({socket_path!r})
told = os.environ.pop({pid_fd!r}, None)  # where to write the command's own pid, if asked
message = json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ),
                      "cwd": os.getcwd()}}).encode()
socket.send_fds(conn, [len(message).to_bytes(4, "big") + message], [0, 1, 2])
stream = conn.makefile("r")
pid = int(stream.readline())
if told is not None:
    os.write(int(told), str(pid).encode() + b"\\n")
    os.close(int(told))
def relay(signum, frame):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, relay)
line = stream.readline()
status = int(line) if line.strip() else -signal.SIGKILL
if status < 0:  # killed by a signal: so is this, by the same one
    if -status in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
    sys.exit(128 - status)  # a signal this process ignores (as Python does SIGPIPE)
sys.exit(status)
"""


def _recv_exactly(conn: socket.socket, size: int, fds: list[int]) -> bytes:
    data = b""
    while len(data) < size:
        chunk, got, _flags, _addr = socket.recv_fds(conn, size - len(data), 3)
        fds.extend(got)
        if not chunk:
            raise ConnectionError("the shim closed its connection")
        data += chunk
    return data


# what the commands that serve until stopped (``serve``, ``sandbox``, ``mcp-proxy``: the
# suite starts about a hundred) import as they start, past their group's module: the HTTP
# API, Slack (bolt), the web face, the MCP SDK (the gateways). About 1 s of CPU a start,
# 700 modules, done once in the server instead (they read no environment as they import)
SERVED = ("approvald.bot.serve", "approvald.bot.mcp.http", "approvald.bot.web.service",
          "approvald.bot.slack.app", "approvald.bot.sandbox.server",
          "approvald.bot.sandbox.workspace", "approvald.bot.mcp.gateway",
          "approvald.bot.mcp.proxy", "approvald.bot.hooks.command")
_MAIN: list[Callable[[], int]] = []  # approvald.bot.cli.main, once imported
_SCRIPT: list[str] = []  # or the Python script this server runs instead (see serve)
_BASE_PATH: list[str] = []  # the interpreter's sys.path: no script's directory, no PYTHONPATH


def _pythonpath(env: Mapping[str, str]) -> list[str]:
    """The entries ``PYTHONPATH`` puts on a process's ``sys.path`` (``site`` makes them
    absolute, from the directory the process starts in)."""
    seen: list[str] = []
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.abspath(entry) not in seen:
            seen.append(os.path.abspath(entry))
    return seen


def _child(request: dict[str, object], fds: list[int]) -> None:
    """In the forked process: become the command, as the console script would run it."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(str(request["cwd"]))
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    argv = request["argv"]
    assert isinstance(argv, list)
    if _SCRIPT:
        _run_script(_SCRIPT[0], env, argv)
    # the console script's sys.path: its own directory (the virtualenv's bin), then its
    # environment's PYTHONPATH, then the interpreter's own (the server's, less its PYTHONPATH)
    sys.path[:] = [str(Path(sys.executable).parent),
                   *(p for p in _pythonpath(env) if p not in _BASE_PATH), *_BASE_PATH]
    sys.argv = [str(Path(sys.executable).parent / "approvald"), *map(str, argv)]
    from approvald.runtime.kernel import failpoints

    failpoints.arm(os.environ.get("APPROVALD_FAILPOINTS", ""))
    sys.argv[0] = re.sub(r"(-script\.pyw|\.exe)?$", "", sys.argv[0])
    _run_and_exit(lambda: sys.exit(_MAIN[0]()))


def _run_and_exit(body: Callable[[], object]) -> None:
    """In the forked process: run ``body`` as the interpreter runs a program, its
    ``SystemExit`` or uncaught exception giving the status, then the exit functions, and
    leave with that status (never returning to the server's code)."""
    import traceback

    status: object = 0
    try:
        body()
    except SystemExit as exc:
        status = exc.code
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if not isinstance(status, int) and status is not None:
            print(status, file=sys.stderr)
        os._exit((status if isinstance(status, int) else 0 if status is None else 1) & 0xFF)


def _run_script(script: str, env: dict[str, str], argv: list[str]) -> None:
    """In the forked process: run ``script`` as ``python SCRIPT ARGV`` would (its directory
    first on ``sys.path``), and exit as it did."""
    import runpy

    sys.path[:] = [str(Path(script).parent),
                   *(p for p in _pythonpath(env) if p not in _BASE_PATH), *_BASE_PATH]
    sys.argv = [script, *map(str, argv)]
    _run_and_exit(lambda: runpy.run_path(script, run_name="__main__"))


def _wait(conn: socket.socket, pid: int) -> None:
    reaped = [False]
    lock = threading.Lock()

    def watch() -> None:
        # the shim sends nothing after its request: end of file is the shim gone (killed,
        # SIGKILL by a test or a timeout); then so is its command, not left running
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        with lock:
            if not reaped[0]:  # dead or not, its pid is still its own until reaped
                os.kill(pid, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    with lock:
        reaped[0] = True
        _, how = os.waitpid(pid, 0)
    status = -os.WTERMSIG(how) if os.WIFSIGNALED(how) else os.WEXITSTATUS(how)
    try:
        conn.sendall(f"{status}\n".encode())
    except OSError:
        pass  # the shim is gone (killed): nobody to tell
    finally:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher, if the shim is still there
        conn.close()


def _serve_one(conn: socket.socket) -> None:
    fds: list[int] = []
    try:
        size = int.from_bytes(_recv_exactly(conn, 4, fds), "big")
        if size > MAX_MESSAGE:
            raise ValueError(f"a message of {size} bytes")
        request = json.loads(_recv_exactly(conn, size, fds))
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} descriptors, not 3")
    except (OSError, ValueError) as exc:
        print(f"zygote: refused a request: {exc}", file=sys.stderr)
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    threading.Thread(target=_wait, args=(conn, pid), daemon=True).start()


def _exit_when_orphaned() -> None:
    while os.read(0, 4096):
        pass
    os._exit(0)


def preload() -> Callable[[], int]:
    """What the server imports before it forks a command: the console script's own import
    (pip's entry-point template), every command group's module (a command imports its
    group's as it starts: the ~670 modules of about a second of CPU) and :data:`SERVED`;
    the console script's ``main``. (tests/unit/test_zygote_preload.py checks that this
    holds everything the commands that serve import as they start.)"""
    import importlib

    from approvald.bot.cli import main
    from approvald.bot.cli.root import groups

    groups()
    for name in SERVED:
        importlib.import_module(name)
    return main


def serve(path: str, script: str | None = None) -> None:
    # what the console script imports from is its own directory (the virtualenv's bin), not
    # this file's (tests/, whose packages must not shadow anything the command imports)
    sys.path[0] = str(Path(sys.executable).parent)
    own = _pythonpath(os.environ)
    _BASE_PATH.extend(p for p in sys.path[1:] if p not in own)
    if script is not None:
        # a script (the MCP fixture server): the modules it imports at its top, imported
        # once here (from its directory, as ``python SCRIPT`` would); its own code runs in
        # each child
        import ast
        import importlib

        sys.path[0] = str(Path(script).parent)
        for node in ast.parse(Path(script).read_text()).body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    importlib.import_module(alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level \
                    and node.module != "__future__":
                importlib.import_module(node.module)
        _SCRIPT.append(script)
    else:
        _MAIN.append(preload())
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    # the parent's end of our stdin closes when the parent dies: then so do we (read with
    # os.read: a thread blocked in sys.stdin would hold its lock in every forked child)
    threading.Thread(target=_exit_when_orphaned, daemon=True).start()
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        _serve_one(conn)


class Warm:
    """This process's warm ``approvald`` (or, given ``script``, a warm ``python SCRIPT``):
    the directory of its shim (:attr:`bin`, made on first use) and the server that answers
    it (:meth:`start`, once; it ends with this process, or when this process closes its
    standard input)."""

    def __init__(self, script: Path | None = None) -> None:
        self.script = script
        self.name = "approvald" if script is None else script.stem
        self._where: Path | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def bin(self) -> Path:
        """The directory holding the ``approvald`` shim."""
        with self._lock:
            if self._where is None:
                # short: a socket's path is at most 107 bytes
                where = Path(tempfile.mkdtemp(prefix="apd-warm-"))
                atexit.register(shutil.rmtree, where, ignore_errors=True)
                shim = where / self.name
                shim.write_text(SHIM.format(python=sys.executable, pid_fd=PID_FD,
                                            socket_path=str(where / "zygote.sock")))
                shim.chmod(0o755)
                (where / "cwd").mkdir()
                self._where = where
            return self._where

    @property
    def approvald(self) -> str:
        """The shim: an ``approvald`` to run as the console script would be run."""
        return str(self.bin / self.name)

    def start(self, env: Mapping[str, str]) -> None:
        """Start the server (unless it runs) with environment ``env``, in a directory of its
        own (nothing a test's working directory holds is importable from it)."""
        where = self.bin
        with self._lock:
            if self._server is not None and self._server.poll() is None:
                return
            (where / "zygote.sock").unlink(missing_ok=True)
            server = subprocess.Popen(
                [sys.executable, __file__, str(where / "zygote.sock"),
                 *([str(self.script)] if self.script is not None else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=dict(env), cwd=where / "cwd")
            assert server.stdout is not None
            ready = server.stdout.readline()
            assert ready == b"ready\n", f"the warm {self.name} did not start: {ready!r}"
            atexit.register(_stop, server)
            self._server = server


def _stop(server: subprocess.Popen[bytes]) -> None:
    assert server.stdin is not None
    server.stdin.close()  # the server exits when its stdin closes
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
