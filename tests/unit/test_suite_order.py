"""The suite's order (tests/conftest.py): slow tests first, the longest of them (a timeout
mark above the suite's) before the others, so neither xdist worker starts a test of
minutes when the other is nearly done."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import pytest_collection_modifyitems


class _Item:
    def __init__(self, name: str, *marks: Any) -> None:
        self.name = name
        self.marks = {m.name: m for m in marks}
        self.fixturenames: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> Any:
        return self.marks.get(name)

    def add_marker(self, mark: Any) -> None:
        pass


def test_slow_tests_first_and_the_longest_of_them_first() -> None:
    slow = pytest.mark.slow.mark
    items = [_Item("fast"), _Item("slow-a", slow),
             _Item("fast-long", pytest.mark.timeout(600).mark),
             _Item("model", slow, pytest.mark.timeout(900).mark), _Item("slow-b", slow),
             _Item("evals", slow, pytest.mark.timeout(600).mark)]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["model", "evals", "slow-a", "slow-b", "fast-long", "fast"]
