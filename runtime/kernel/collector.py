"""The cyclic garbage collector held off while a reader builds or walks a record that
makes hundreds of thousands of objects, none of them garbage (issue 51: the replay and
the insights over a million audit entries). Each collection the allocations trigger
walks the objects already made again; at a million entries these collections cost the
insights about as much as their own work (docs/performance.md). Memory is still freed
as it always is (reference counting); only cycles wait, until the collector is on again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside; the collector on again after it, if it was (nested
    pauses leave it to the outermost)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
