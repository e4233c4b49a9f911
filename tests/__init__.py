"""The test suite's package (its modules import one another as ``tests.*``).

Its compiled modules are kept in ``__pycache__`` whatever ``PYTHONDONTWRITEBYTECODE`` says
(this project's machine sets it, .ci/run unsets it for the same reason): this package is
imported before any test module or ``approvald`` module, in the pytest process and in each
xdist worker, and without a cache each of the fast tier's workers rewrote the asserts of
all ~390 test modules and compiled ``approvald`` again on every run, about 10 s of CPU a
worker of its 17 s start. Written once, a later run reads them (pytest's rewritten test
modules are keyed by the source's hash, Python's by its mtime).
"""

import sys

sys.dont_write_bytecode = False
