"""The suite's compiled modules (tests/__init__.py, tests/conftest.py): kept whatever
``PYTHONDONTWRITEBYTECODE`` says, and a test module's rewritten asserts compiled once by
the xdist controller where each worker's import hook looks for them first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _rewrite_once


def test_the_suite_keeps_its_compiled_modules() -> None:
    import tests.helpers

    assert sys.dont_write_bytecode is False
    source = Path(tests.helpers.__file__)
    assert list((source.parent / "__pycache__").glob("helpers.*.pyc")), \
        "tests/helpers.py, imported by this process, was not kept compiled"


def test_a_test_module_is_rewritten_where_pytests_import_hook_looks(
        tmp_path: Path, pytestconfig: pytest.Config) -> None:
    from _pytest.assertion import rewrite

    module = tmp_path / "test_sample.py"
    module.write_text("def test_it():\n    seen = 1\n    assert seen == 2\n")
    broken = tmp_path / "test_broken.py"  # left to its worker's collection to report
    broken.write_text("def test_it(:\n")
    _rewrite_once(pytestconfig, [broken, module])
    code = rewrite._read_pyc(module, rewrite.get_cache_dir(module)
                             / ("test_sample" + rewrite.PYC_TAIL))
    assert code is not None, "no rewritten module where pytest's import hook reads it"
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    # the assert rewritten, as pytest's hook would have: it says what it compared
    with pytest.raises(AssertionError, match=r"assert 1 == 2"):
        namespace["test_it"]()
