"""Named crash points at durability boundaries, armed by ``APPROVALD_FAILPOINTS``.

``APPROVALD_FAILPOINTS=after_intent`` makes the process SIGKILL itself the first time it
reaches ``after_intent``; ``after_intent@3`` on the third time. Several points are
comma-separated. With the variable unset, :func:`failpoint` is one dict lookup, in C.

Known points, in the order a gated call meets them: ``mid_model_call`` (the reply came
back, nothing recorded yet), ``after_intent``, ``before_call`` (every tool invocation, an
idempotent one with no intent row too, is about to start), ``before_result`` (the tool
ran, its result is not recorded), ``after_result``, ``before_checkpoint``, ``after_checkpoint``,
``after_commit_before_post`` (a request is committed, its card not yet sent),
``after_decision``, ``after_post_before_mark`` (Slack has the card, the outbox row does
not know it yet), ``after_thread_post_before_record`` (a run-thread message is posted,
the thread row does not know it yet).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from approvald.runtime.kernel.errors import ConfigError

_ENV = "APPROVALD_FAILPOINTS"
ENVIRONMENT = {_ENV: "for tests of durability: named crash points at which the process "
                     "kills itself (`after_intent`, `after_intent@3`, comma-separated); "
                     "never set it in production. A malformed value stops a command with "
                     "one line"}
KNOWN = ("mid_model_call", "after_intent", "before_call", "before_result", "after_result",
         "before_checkpoint", "after_checkpoint", "after_commit_before_post", "after_decision",
         "after_post_before_mark", "after_thread_post_before_record")


def _parse(spec: str) -> dict[str, int]:
    """``name`` or ``name@N`` items, comma-separated; a typo is a :class:`ConfigError`
    (an armed point that can never fire would make a crash test pass without crashing)."""
    armed: dict[str, int] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, at, nth = item.partition("@")
        if name not in KNOWN:
            raise ConfigError(f"{_ENV}: unknown failpoint {name!r} (known: {', '.join(KNOWN)})")
        if at and not (nth.isdigit() and int(nth) >= 1):
            raise ConfigError(f"{_ENV}: {item!r}: the count after @ must be a whole number "
                              "of 1 or more")
        armed[name] = int(nth) if at else 1
    return armed


def check() -> None:
    """Raise :class:`ConfigError` if ``APPROVALD_FAILPOINTS`` is malformed (the module
    itself arms nothing then, rather than fail at import)."""
    _parse(os.environ.get(_ENV, ""))


def _from_env() -> dict[str, int]:
    try:
        return _parse(os.environ.get(_ENV, ""))
    except ConfigError:
        return {}  # reported by check(), which the command line calls first


def _kill(name: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_armed: dict[str, int] = _from_env()
_hits: dict[str, int] = {}
_action: Callable[[str], None] = _kill


def hits(name: str) -> int:
    """How many times this process has passed ``name`` while it was armed."""
    return _hits.get(name, 0)


class _Passed(dict[str, None]):
    """Each known point not armed, passed with a lookup in C (no Python call: an approval
    passes a dozen; issue 50). An armed point, or a name not known, is missing here: the
    lookup calls :meth:`__missing__`, which counts the hit."""

    def __missing__(self, name: str) -> None:
        target = _armed.get(name)
        if target is None:
            return
        hit = _hits.get(name, 0) + 1
        _hits[name] = hit
        if hit == target:
            _action(name)

    def rearmed(self) -> None:
        self.clear()
        self.update(dict.fromkeys(n for n in KNOWN if n not in _armed))


_passed = _Passed()
_passed.rearmed()
# ``failpoint(name)``: SIGKILL this process if ``name`` is armed and this is the armed hit
failpoint: Callable[[str], None] = _passed.__getitem__


def arm(spec: str, action: Callable[[str], None] | None = None) -> None:
    """Re-arm from a spec string, optionally with an in-process ``action`` instead of SIGKILL.

    In-process tests raise from ``action`` to abandon work at a boundary; crash tests run
    real subprocesses with ``APPROVALD_FAILPOINTS`` and get a real SIGKILL.
    """
    global _armed, _action
    _armed = _parse(spec)
    _action = action or _kill
    _hits.clear()
    _passed.rearmed()
