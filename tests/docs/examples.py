"""The shell and Python examples of the docs pages, read out of their markdown and run.

Every fenced block whose language is ``bash``, ``sh``, ``shell``, ``console``, ``python``
or ``py`` in ``docs/**/*.md`` is an example, and every example runs, unless the page says
why not. A page marks a block with an HTML comment on the lines just before it (blank lines
between are allowed), which the built site does not show:

``<!-- not-run: REASON -->``
    the block is not run (a command that serves until stopped, one that needs a real Slack
    workspace, a fragment of a larger program); the reason is required and is listed with
    the blocks that ran, so nothing is left out silently;
``<!-- expect-exit: N -->``
    the block is run and must exit with status N (an example that shows a refusal);
``<!-- save-as: FILE -->``
    the block is a file the page has the reader write (``myagents.py``): it is saved in the
    page's directory, for the blocks after it, and a Python file is run once there, so a
    name it imports that no longer exists fails;
``<!-- run-by: tests/PATH.py -->``
    the block is run by that test instead (one that needs a running service, say); the
    test file must exist and name the page, so the claim is checked, and it is listed.

The blocks of one page run in order, as a reader would paste them into one terminal at the
top of a checkout (the page's fresh directory holds links to the repository's top-level
folders and files, so ``bot/evals/datasets/…`` and ``tests/…`` are found), with an empty
``HOME`` (so the embedded database is a new one per
page, already holding two unrelated waiting requests, as a reader's would: see
:func:`seed`), approvald's ``APPROVALD_*`` and ``SLACK_*`` variables cleared, and this virtualenv's
``bin`` first on ``PATH`` (``approvald`` is the installed console script), and the OpenAI
variables naming a key that is not one and a local address nobody serves (an agent can be
built, but an example that would call a model fails at once instead of reaching out). A shell block
runs under ``bash -euo pipefail``, with the variables the page's earlier shell blocks
set (exported or not, as in one terminal) and in the directory they left; if its lines
start with a ``$ `` prompt, only those lines are commands (the others are output shown to
the reader). A Python block runs with this interpreter, from stdin, in the page's
directory.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests import helpers

SHELL = ("bash", "sh", "shell", "console")
PYTHON = ("python", "py")
TIMEOUT = 300.0  # seconds one block may take (one that serves until stopped: not-run)
ROOT = Path(__file__).resolve().parents[2]
# what of the checkout a page's directory links to (the reader is at its top)
CHECKOUT = ("bot", "runtime", "store", "tests", "docs", "pyproject.toml", "README.md",
            "manifest.yml", "mkdocs.yml", "LICENSE")

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\n]*)$")
_MARKER = re.compile(
    r"^\s*<!--\s*(?P<kind>not-run|expect-exit|run-by|save-as)\s*:?\s*(?P<arg>.*?)\s*-->\s*$")


# what the examples tests ran and left out, in order, for the session's summary
# (tests/docs/conftest.py prints it at the end of the run)
LOG: list[str] = []


class MarkerError(ValueError):
    pass


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None = None  # the reason, when the page says not to run it
    expect_exit: int = 0
    run_by: str | None = None  # the test that runs it instead
    save_as: str | None = None  # the file the reader saves it as

    @property
    def runnable(self) -> bool:
        return self.lang in SHELL + PYTHON

    def where(self, root: Path | None = None) -> str:
        page = self.page
        if root is not None and page.is_relative_to(root):
            page = page.relative_to(root)
        return f"{page}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, with the markers that precede it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            marker = _MARKER.match(lines[i])
            if marker and not _next_is_fence(lines, i + 1):
                raise MarkerError(f"{page}:{i + 1}: {marker.group('kind')} is not right before "
                                  "a fenced block")
            i += 1
            continue
        fence, lang = m.group("fence"), (m.group("info").split() or [""])[0].lower()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(m.group("indent")):])
            i += 1
        i += 1
        not_run, expect, run_by, save_as = _markers(page, lines, start)
        found.append(Block(page, start + 1, lang, "\n".join(body) + "\n", not_run, expect,
                           run_by, save_as))
    return found


def _next_is_fence(lines: list[str], i: int) -> bool:
    while i < len(lines) and (not lines[i].strip() or _MARKER.match(lines[i])):
        i += 1
    return i < len(lines) and bool(_FENCE.match(lines[i]))


def _markers(page: Path, lines: list[str],
             fence: int) -> tuple[str | None, int, str | None, str | None]:
    not_run, expect, run_by, save_as = None, 0, None, None
    j = fence - 1
    while j >= 0 and (not lines[j].strip() or _MARKER.match(lines[j])):
        m = _MARKER.match(lines[j])
        if m:
            arg = m.group("arg")
            if m.group("kind") == "save-as":
                if not re.fullmatch(r"[\w.-]+", arg):
                    raise MarkerError(f"{page}:{j + 1}: save-as names a file in the page's "
                                      f"directory, got {arg!r}")
                save_as = arg
            elif m.group("kind") == "run-by":
                if not re.fullmatch(r"tests/[\w/]+\.py", arg):
                    raise MarkerError(f"{page}:{j + 1}: run-by names a test file "
                                      f"(tests/....py), got {arg!r}")
                run_by = arg
            elif m.group("kind") == "not-run":
                if not arg:
                    raise MarkerError(f"{page}:{j + 1}: not-run needs a reason "
                                      "(<!-- not-run: why -->)")
                not_run = arg
            else:
                if not arg.isdigit():
                    raise MarkerError(f"{page}:{j + 1}: expect-exit needs a number "
                                      f"(got {arg!r})")
                expect = int(arg)
        j -= 1
    return not_run, expect, run_by, save_as


def shell_script(code: str) -> str:
    lines = code.splitlines()
    if any(line.startswith("$ ") for line in lines):
        commands: list[str] = []
        for line in lines:
            if line.startswith("$ "):
                commands.append(line[2:])
            elif commands and commands[-1].endswith("\\"):
                commands.append(line)  # a command continued on the next line
        return "\n".join(commands) + "\n"
    return code


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("APPROVALD_", "SLACK_", "XDG_", "OPENAI_"))}
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(_warm_bin()), str(Path(sys.executable).parent),
                                   env.get("PATH", "")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OPENAI_API_KEY"] = "sk-docs-examples-not-a-key"
    env["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"  # the discard port: nothing answers
    return env


@dataclass(frozen=True)
class Ran:
    block: Block
    status: int
    output: str


# a page's shell blocks share one terminal's state: each starts from the variables (exported
# or not, as in a reader's terminal), the shell functions and the directory the one before it
# left (saved when it ends, whatever its status)
_KEEP = """
__approvald_docs_base=" $(compgen -v | tr '\\n' ' ') "
__approvald_docs_save() {{
  {{ export -p | grep -Ev '^declare -x (PWD|OLDPWD|SHLVL|_)='
    for __approvald_docs_v in $(compgen -v); do
      case "$__approvald_docs_base" in *" $__approvald_docs_v "*) continue;; esac
      case "$__approvald_docs_v" in __approvald_docs_*|_|PWD|OLDPWD) continue;; esac
      declare -p "$__approvald_docs_v"
    done
    declare -f | awk '/^__approvald_docs_save /{{skip=1}} skip&&/^}}$/{{skip=0;next}} !skip'
  }} > {state}; pwd > {where}; }}
trap __approvald_docs_save EXIT
if [ -f {state} ]; then . {state}; cd "$(cat {where})"; fi
"""


def run(block: Block, cwd: Path, env: dict[str, str]) -> Ran:
    if block.save_as is not None:
        (cwd / block.save_as).write_text(block.code, encoding="utf-8")
        if not block.save_as.endswith(".py"):
            return Ran(block, 0, "")
        argv = [sys.executable, "-c", f"import runpy; runpy.run_path({block.save_as!r})"]
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)
        return Ran(block, done.returncode, done.stdout + done.stderr)
    if block.lang in SHELL:
        keep = _KEEP.format(state=cwd / ".docs-example-env", where=cwd / ".docs-example-cwd")
        argv = ["bash", "-euo", "pipefail", "-c", keep + shell_script(block.code)]
        stdin = None
    else:
        argv, stdin = [sys.executable, "-"], block.code
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True,
                              text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Ran(block, -1, f"{out}\n(still running after {TIMEOUT:g} s: a block that "
                              "serves until stopped needs <!-- not-run: reason -->)")
    return Ran(block, done.returncode, done.stdout + done.stderr)


# what a reader's database already holds when they follow a page: requests of other runs and
# of other faces, waiting, so that a command picking "the first waiting request" instead of
# the one the page started (``approvals list --ids | head -1``) acts on the wrong one and fails
UNRELATED_TASK = "An unrelated refund, waiting since before this page was followed"
UNRELATED_HOOK_EVENT = (
    '{"hook_event_name": "PreToolUse", "session_id": "s-unrelated", "cwd": "/srv/other", '
    '"tool_use_id": "toolu_unrelated", "tool_name": "Bash", '
    '"tool_input": {"command": "make release"}}')


# the seeded database is made by two ``approvald`` processes once, and copied into each page's
# home: a page gets it at most SEED_FRESH_FOR seconds after it was made, so its requests have
# most of their 30 minutes (the default ttl) left and are waiting, as a reader's would be
SEED_FRESH_FOR = 600.0
_SEEDED: list[tuple[float, Path]] = []  # (when made, the database) in this process
EMBEDDED_DB = Path(".local") / "share" / "approvald" / "approvald.db"  # under HOME


def seed(workdir: Path, env: dict[str, str]) -> None:
    """Put two unrelated waiting requests (an agent's refund, a Claude Code call) in the
    embedded database the page's commands use: a copy of one seeded by
    :func:`seed_database` at most :data:`SEED_FRESH_FOR` seconds ago."""
    start_warm_approvald()
    if not _SEEDED or time.monotonic() - _SEEDED[0][0] > SEED_FRESH_FOR:
        made = Path(tempfile.mkdtemp(prefix="approvald-docs-seed-"))
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        seed_env = {**env, "HOME": str(made / "home")}
        seed_database(made, seed_env)
        _SEEDED[:] = [(time.monotonic(), made / "home" / EMBEDDED_DB)]
    target = Path(env["HOME"]) / EMBEDDED_DB
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_SEEDED[0][1], target)


def seed_database(workdir: Path, env: dict[str, str]) -> None:
    """The two unrelated waiting requests, made by ``approvald`` as a reader's other work
    made them, in the embedded database under ``env``'s ``HOME``."""
    approvald = str(_warm_bin() / "approvald")
    for argv, stdin in (
            ([approvald, "run", "demo-refund", "--task", UNRELATED_TASK,
              "--requested-by", "U_SEED"], None),
            ([approvald, "hook", "claude-code", "--requested-by", "U_SEED", "--wait", "0"],
             UNRELATED_HOOK_EVENT)):
        done = subprocess.run(argv, cwd=workdir, env=env, input=stdin, capture_output=True,
                              text=True, timeout=TIMEOUT, check=False)
        assert done.returncode == 0, f"seeding the page's database failed: {done.stderr}"
    assert (Path(env["HOME"]) / EMBEDDED_DB).exists(), "the seed made no embedded database"
    # nothing else of the seed's is left for a page: no -wal or -journal beside it
    assert sorted(p.name for p in (Path(env["HOME"]) / EMBEDDED_DB).parent.iterdir()) == \
        ["approvald.db"]


# ``approvald`` on a page's PATH: the warm one of tests/zygote.py (a process forked per
# command from one that has done the console script's import), not the console script,
# whose ~670 imports cost about a second of CPU per command. The same server as the tests'
# subprocess ``approvald`` (tests/helpers.py): a command's environment is its own, not the
# server's, so one server a test process serves both (a second cost its ~2 s of imports)
WARM = helpers.WARM


def _warm_bin() -> Path:
    """The directory holding the ``approvald`` shim (made on first use; the server that
    answers it is started by :func:`start_warm_approvald`)."""
    return WARM.bin


def start_warm_approvald() -> None:
    """Start this process's warm ``approvald`` server, once; it ends with this process."""
    WARM.start(environment(WARM.bin / "home"))


def run_page(page: Path, workdir: Path) -> tuple[list[Ran], list[Block]]:
    """Run a page's examples in order in ``workdir``: (what ran, what the page says not to
    run). Stops at the first block that does not exit as expected (the next ones may need
    it); that one is the last of the list."""
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    for top in CHECKOUT:
        if (ROOT / top).exists() and not (workdir / top).exists():
            (workdir / top).symlink_to(ROOT / top)
    env = environment(home)
    ran: list[Ran] = []
    skipped: list[Block] = []
    for block in blocks(page):
        if not block.runnable:
            continue
        if block.not_run is not None or block.run_by is not None:
            skipped.append(block)
            continue
        if not ran:
            seed(workdir, env)  # before the first block that runs (none: nothing started)
        result = run(block, workdir, env)
        ran.append(result)
        if result.status != block.expect_exit:
            break
    return ran, skipped
