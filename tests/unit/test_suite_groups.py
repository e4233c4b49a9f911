"""``xdist_group`` is in force (tests/conftest.py's ``group_ids``): under ``--dist
loadgroup`` a grouped test's node id names its group, which is what sends the group's tests
to one worker (the adapters' tests import their framework once, the wheel is built once).
pytest-xdist 3.8 sets an attribute pytest 9 no longer reads, so without ``group_ids`` the
ids stayed plain and the groups were spread over the workers."""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadGroupScheduling

from tests.conftest import group_ids

pytestmark = pytest.mark.xdist_group("suite_groups")


def _sibling(request: pytest.FixtureRequest, name: str) -> pytest.Function:
    """A real test item of this module (its marks, its module's ``pytestmark``)."""
    return pytest.Function.from_parent(request.node.parent, name=name,
                                       callobj=test_a_grouped_test_is_sent_with_its_group)


def test_a_grouped_test_is_sent_with_its_group(request: pytest.FixtureRequest) -> None:
    item = _sibling(request, "test_a_grouped_test_is_sent_with_its_group")
    plain = item.nodeid
    group_ids([item], loadgroup=True)
    assert item.nodeid == f"{plain}@suite_groups"
    # the controller's own reading of the id: the group is the unit of work
    assert LoadGroupScheduling._split_scope(None, item.nodeid) == "suite_groups"  # type: ignore[arg-type]
    group_ids([item], loadgroup=True)  # once only
    assert item.nodeid == f"{plain}@suite_groups"


def test_without_loadgroup_the_ids_stay_plain(request: pytest.FixtureRequest) -> None:
    item = _sibling(request, "test_without_loadgroup_the_ids_stay_plain")
    plain = item.nodeid
    group_ids([item], loadgroup=False)
    assert item.nodeid == plain and "@" not in plain


def test_this_run_sends_this_module_as_one_group(request: pytest.FixtureRequest) -> None:
    """Under xdist with loadgroup (the README's and CI's ``pytest``), this very test's id
    names its group; run in one process (``-n 0``) it is plain."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("::test_this_run_sends_this_module_as_one_group"
                                            "@suite_groups"), request.node.nodeid
    else:
        assert "@" not in request.node.nodeid
