"""The tests' warm ``approvald`` (tests/zygote.py) imports, once, what the commands that serve
until stopped (``serve``, ``sandbox``, ``mcp-proxy``: :data:`tests.helpers.OWN_PROCESS`,
about a hundred starts a run) import as they start, so that a start forked from it imports
nothing of approvald's own. Nothing else would notice when one of them started importing a
module the server does not (the saving would just shrink), or when :data:`SERVED` named a
module that is gone.

What the commands import is read from the sources: every import of approvald's, at a
module's top or in any of its functions, from the console script's and the commands' own
modules on (a superset of what one start runs: :data:`ELSEWHERE` names the few imports no
start of theirs makes); what the server imports, from a fresh interpreter that does it."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from approvald.bot.cli.root import COMMANDS

from tests.helpers import OWN_PROCESS
from tests.zygote import SERVED

ROOT = Path(__file__).resolve().parents[2]

# what the commands' modules import only on a path their start does not take: (the module
# imported, the module that imports it) -> where it is imported. Each was seen not imported
# by a started ``serve`` (SQLite and keys, the HTTP API), ``sandbox`` and ``mcp-proxy``
# (python -X importtime), and each is still imported where it says, and not preloaded
ELSEWHERE = {
    # (bot/launch.py's hook functions, which the serving commands reach, are `approvald
    # hook`'s)
    ("approvald.bot.hooks.handoff", "approvald.bot.hooks.command"):
        "`approvald hook install`, and a hook handing its call to serve (--serve)",
    ("approvald.bot.hooks.settings_file", "approvald.bot.hooks.command"):
        "`approvald hook install` and `hook check`: Claude Code's settings files",
    ("approvald.runtime.models.openai", "approvald.runtime.models"):
        "an agent whose model is OpenAI's: the package's __getattr__, on first use",
    ("approvald.runtime.record.history_fold", "approvald.runtime.record.history"):
        "the history read with an audit key (insights, the board): on a request",
}


@functools.cache
def _source(module: str) -> Path | None:
    """The file of approvald's module ``module`` (None: there is none), found without
    importing it (nor, below approvald's three packages, anything)."""
    parent, _, name = module.rpartition(".")
    if parent == "approvald":
        spec = importlib.util.find_spec(module)
        return Path(spec.origin) if spec is not None and spec.origin is not None else None
    above = _source(parent) if parent.startswith("approvald.") else None
    if above is None or above.name != "__init__.py":
        return None
    return next((f for f in (above.parent / f"{name}.py", above.parent / name / "__init__.py")
                 if f.is_file()), None)


@functools.cache
def _tree(module: str) -> ast.Module:
    source = _source(module)
    assert source is not None, module
    return ast.parse(source.read_text(), str(source))


def _modules_of(package: str, names: list[str]) -> set[str]:
    """The modules ``from package import names`` imports past ``package``: a name that is a
    module, or one a lazy package (``approvald.runtime``: its ``_EXPORTS``, read by its
    ``__getattr__``) imports from its module on first use."""
    exports: dict[str, str] = {}
    if _source(package) is not None:
        for node in _tree(package).body:
            if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None and \
                    "_EXPORTS" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign)
                                              else node.target):
                exports = ast.literal_eval(node.value)
    found = set()
    for name in names:
        if _source(f"{package}.{name}") is not None:
            found.add(f"{package}.{name}")
        elif name in exports:
            found.add(f"{package}.{exports[name].partition(':')[0]}")
    return found


@functools.cache
def _imported_by(module: str) -> frozenset[str]:
    """The modules of approvald that ``module``'s source imports, at its top or inside a
    function (what a start may run), less what it imports for type checking only; a
    package's import of ``a.b.c`` imports ``a`` and ``a.b`` too."""
    source = _source(module)
    assert source is not None, module
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(statements: list[Any]) -> None:  # (an import is a statement: no expressions)
        for node in statements:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                   package)
                found.add(base)
                if base.startswith("approvald."):
                    found.update(_modules_of(base, [a.name for a in node.names]))
            for inner in ("body", "orelse", "finalbody", "handlers", "cases"):
                visit(getattr(node, inner, None) or [])

    visit(_tree(module).body)
    return frozenset(m.rsplit(".", k)[0] for m in found if m.startswith("approvald.")
                     for k in range(m.count(".")))


def _started() -> dict[str, str]:
    """Every module of approvald that starting the commands that serve may import, each
    with the module that imports it: what the console script imports (its dispatch), the
    commands' group module, and what each of these imports, at its top or in a function,
    and so on (ELSEWHERE's edges left out)."""
    groups = {f"approvald.bot.cli.{group}" for name, group, _ in COMMANDS
              if name in OWN_PROCESS}
    by = {m: "(a root)" for m in ("approvald.bot.cli", *groups)}
    todo = list(by)
    while todo:
        module = todo.pop()
        for name in sorted(_imported_by(module)):
            if name not in by and (name, module) not in ELSEWHERE:
                by[name] = module
                todo.append(name)
    return by


def _preloading() -> subprocess.Popen[str]:
    """The modules of approvald the warm server has imported before it forks a command
    (tests/zygote.py's ``preload``), listed by a fresh interpreter as the server is one."""
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
              "from tests.zygote import preload; preload(); "
              "print(json.dumps(sorted(m for m in sys.modules if m.startswith('approvald'))))")
    return subprocess.Popen([sys.executable, "-c", script, str(ROOT)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow  # one fresh interpreter: what the server imports, ~1 s
def test_the_warm_approvald_preloads_what_the_serving_commands_import() -> None:
    gone = [name for name in SERVED if _source(name) is None]
    assert not gone, f"tests/zygote.py's SERVED names modules that no longer exist: {gone}"
    assert set(OWN_PROCESS) <= {name for name, _, _ in COMMANDS}, OWN_PROCESS
    with _preloading() as preloading:  # (while this process reads the sources)
        started = _started()
        out, err = preloading.communicate(timeout=120)
    assert preloading.returncode == 0, err
    preloaded = set(json.loads(out))
    missing = {name: by for name, by in started.items() if name not in preloaded}
    assert not missing, (
        "starting serve, sandbox or mcp-proxy imports modules the warm approvald does not "
        "(add them, or the module that imports them, to SERVED in tests/zygote.py): "
        f"{missing}")
    # each path left out is still there, and still not preloaded (else: drop it here)
    for name, by in ELSEWHERE:
        assert by in started and name in _imported_by(by), (name, by)
        assert name not in preloaded, name
