"""runtime/ in layers (issue 47 item 3): the life of a gated call, bottom to top.

``kernel`` (errors, clock, ids, canonical JSON) < ``policies`` (what may be called, who
approves it) < ``record`` (what is written down: audit chain, outbox, ledger, run state) <
``requests`` (a gated call becomes a request) < ``approvals`` (the request decided) <
``runs`` (the agent loop, the worker, callers' calls) < ``top`` (runtime/ itself: the engine
and the read models) < ``facade`` (runtime/__init__.py, the names docs and faces import).

A module imports only from its own layer or one below: module-level and function-level
imports alike, and ``TYPE_CHECKING`` imports too (none needs the exception). The checker is
``.ci/architecture.py``'s (it prints "layers with an upward import: N"); these tests hold it
to 0 and show it can fail.
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest

from tests.helpers import ci_architecture, ci_script

ROOT = Path(__file__).resolve().parents[2]
ORDER = ("kernel", "policies", "record", "requests", "approvals", "runs", "top", "facade")



def test_the_layers_are_in_this_order_and_each_is_a_package() -> None:
    architecture = ci_architecture()
    assert architecture.LAYERS == ORDER
    for layer in ORDER[:-2]:
        assert (ROOT / "runtime" / layer / "__init__.py").is_file(), layer
    assert {p.stem for p in (ROOT / "runtime").glob("*.py")} - {"__init__"} \
        == architecture.TOP_MODULES


def test_no_runtime_module_imports_a_higher_layer_and_each_is_in_a_layer() -> None:
    upward, unplaced = ci_architecture().layer_crossings()
    assert [where for _, _, where in upward] == []
    assert unplaced == [], ("add each to a layer (runtime/<layer>/, or TOP_MODULES in "
                            ".ci/architecture.py and /work/h53b_move.py's TABLE)")


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    runtime = tmp_path / "runtime"
    for name, text in {"__init__.py": "", **{f"{layer}/__init__.py": ""
                                            for layer in ORDER[:-2]}, **files}.items():
        (runtime / name).parent.mkdir(parents=True, exist_ok=True)
        (runtime / name).write_text(text)
    return runtime


@pytest.mark.parametrize("files", [
    # module level, absolute
    {"kernel/clock.py": "from approvald.runtime.record.audit import AuditKey\n",
     "record/audit.py": ""},
    # function level, ``from <layer> import <module>``
    {"policies/policy.py": "def f():\n    from approvald.runtime.runs import agent\n",
     "runs/agent.py": ""},
    # under TYPE_CHECKING, relative
    {"record/ledger.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from ..approvals.decide import Decider\n",
     "approvals/decide.py": ""},
    # a layer reaching the top, and the top reaching the facade
    {"runs/runner.py": "import approvald.runtime.engine\n", "engine.py": ""},
    {"engine.py": "from approvald.runtime import Agent\n"},
])
def test_an_upward_import_is_counted(tmp_path: Path, files: dict[str, str]) -> None:
    architecture = ci_architecture()
    architecture.RUNTIME, architecture.ROOT = _tree(tmp_path, files), tmp_path
    upward, unplaced = architecture.layer_crossings()
    assert len(upward) == 1 and unplaced == [], (upward, unplaced)
    assert architecture.layers_with_an_upward_import(upward, unplaced) == 1


def test_a_downward_or_sideways_import_is_not(tmp_path: Path) -> None:
    architecture = ci_architecture()
    architecture.RUNTIME, architecture.ROOT = _tree(tmp_path, {
        "kernel/errors.py": "", "kernel/clock.py": "from . import errors\n",
        "record/audit.py": "from approvald.runtime.kernel import clock\n",
        "engine.py": "from approvald.runtime.record.audit import AuditKey\n"
                     "from approvald.runtime.models.base import Model\n",
        "models/__init__.py": "", "models/base.py": "from ..kernel.errors import X\n"}), tmp_path
    assert architecture.layer_crossings() == ([], [])


def test_a_module_in_no_layer_is_counted(tmp_path: Path) -> None:
    architecture = ci_architecture()
    architecture.RUNTIME, architecture.ROOT = _tree(tmp_path, {
        "newcomer.py": "", "stray/__init__.py": "", "stray/thing.py": ""}), tmp_path
    upward, unplaced = architecture.layer_crossings()
    assert (upward, unplaced) == ([], ["runtime/newcomer.py", "runtime/stray/__init__.py",
                                       "runtime/stray/thing.py"])


# the adapters' names resolve by importing their frameworks (seconds): on the worker that
# runs the adapters' tests, which imports them anyway (tests/integration/test_adapter_*.py)
@pytest.mark.xdist_group("adapters")
def test_the_facade_names_what_it_exports_and_each_name_resolves() -> None:
    import approvald.runtime as runtime

    assert sorted(runtime.__all__) == sorted(runtime._EXPORTS)  # in ruff's order (RUF022)
    assert len(set(runtime.__all__)) == len(runtime.__all__)
    for name in runtime.__all__:
        value = getattr(runtime, name)
        module, _, attribute = runtime._EXPORTS[name].partition(":")
        if isinstance(value, types.ModuleType):  # a module the faces use whole (``binding``)
            assert value.__name__ == f"approvald.runtime.{module}" \
                and module.rsplit(".", 1)[-1] == name, (name, value)
        else:
            if isinstance(value, type | types.FunctionType):  # a class or function, no alias
                assert value.__name__ == (attribute or name), (name, value)
            assert getattr(importlib.import_module(f"approvald.runtime.{module}"),
                           attribute or name) is value, name
    with pytest.raises(AttributeError):
        runtime.nothing_of_that_name  # noqa: B018


def test_the_click_paths_calls_up_a_layer_are_told_apart_from_calls_down():
    """``.ci/click_path.py`` names each call the click makes from a module into a higher
    layer (the worker calling back up into the engine, a callback into a face): a call
    down, or within one layer, is not one."""
    click_path = ci_script("click_path")
    calls = {
        ("approvald.runtime.runs.worker", "approvald.runtime.engine"),        # up
        ("approvald.runtime.engine", "approvald.runtime.runs.worker"),        # down
        ("approvald.store.db", "approvald.runtime.kernel.clock"),             # up
        ("approvald.runtime.kernel.signals", "approvald.bot.serve"),          # up
        ("approvald.bot.slack.decisions", "approvald.runtime.engine"),        # down
        ("approvald.runtime.record.audit", "approvald.runtime.record.outbox"),  # within
        ("approvald.runtime.requests.packet", "approvald.store.repos.runs"),  # down
    }
    assert click_path.up_a_layer(calls) == [
        ("approvald.runtime.kernel.signals", "approvald.bot.serve"),
        ("approvald.runtime.runs.worker", "approvald.runtime.engine"),
        ("approvald.store.db", "approvald.runtime.kernel.clock"),
    ]
