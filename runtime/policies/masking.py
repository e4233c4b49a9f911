"""The one funnel everything shown of a call goes through (issue 46).

:class:`Masking` is what may be shown of one call (or of every call of a run): the
declared paths and the values found under them, with the detectors. The rules it applies
are :mod:`runtime.policies.sensitive`'s (its docstring says them); this module is how.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from approvald.runtime.policies.detectors import (
    ELLIPSIS,
    MASKED,
    Detectors,
    active,
    is_mask,
    mask_text,
    mask_value,
    spliced,
)

MIN_ANYWHERE = 4  # a declared value this long is masked wherever it occurs
CUT_MIN = 8  # characters of a cut-off declared value's start that are masked
FRAGMENT = 12  # a run of this many characters of a declared value is masked anywhere
# characters of each declared value its runs are taken from (a run of 12 from further on
# in a longer value, a file's content, is not recognised: its whole and its start are)
FRAGMENT_SOURCE = 4096
_PIECE = FRAGMENT // 2

# where a record (an audit entry's details, a webhook, an API document) holds a call's
# arguments, under which its sensitive paths apply
ARGS_KEYS: tuple[str, ...] = ("args", "arguments", "edited_args", "effective_args",
                              "previous_args", "original_args", "scope_value.values")
# what a record says in the runtime's own words (names, ids, digests, statuses, counts,
# the policy it ran under): kept as recorded, since the audit chain's verifier reads
# them, and a declared value never reaches them (only the detectors run there)
KEPT_KEYS = frozenset({
    "kind", "tool", "call_id", "status", "policy", "policy_digest", "policy_file", "rule",
    "answer", "source", "subject", "standing_approval", "approvers", "quorum", "rung",
    "idempotency_key", "supersedes", "question", "attempts", "verdict", "risk", "edits",
    "expires_at", "started_at", "heard_at", "latency_ms", "reported_by", "requested_by",
})


# -- paths ---------------------------------------------------------------------------------

def _compile(paths: Iterable[str]) -> list[tuple[str, ...]]:
    return [tuple(p.split(".")) for p in paths if p]


def _step(live: Sequence[tuple[str, ...]], key: str) -> tuple[list[tuple[str, ...]], bool]:
    """The paths still to match below ``key`` (of those ``live`` at its parent), and
    whether one of them ends there: the value under ``key`` is declared whole. A subtree
    no path reaches is walked without looking again."""
    below = [p[1:] for p in live if p[0] == "*" or p[0] == key]
    return below, any(not p for p in below)


def declared_values(args: Any, paths: Iterable[str]) -> list[Any]:
    """The scalars (strings and numbers) ``args`` holds under the declared ``paths``."""
    patterns = _compile(paths)
    out: list[Any] = []
    if patterns:
        _collect(args, patterns, out)
    return out


def _collect(value: Any, live: Sequence[tuple[str, ...]], out: list[Any]) -> None:
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return
    for k, v in items:
        below, hit = _step(live, str(k))
        if hit:
            _leaves(v, out)
        elif below:
            _collect(v, below, out)


def _leaves(value: Any, out: list[Any]) -> None:
    if isinstance(value, Mapping):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, list | tuple):
        for v in value:
            _leaves(v, out)
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        out.append(value)


# -- the funnel --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Form:
    """One way a declared value is written in text, and what stands in its place."""

    text: str
    mask: str
    word: bool  # short: masked only where it stands as a word of its own


def _forms(value: Any) -> tuple[_Form, ...]:
    if isinstance(value, str) and len(value) > _FORMS_KEPT:
        return _forms_of.__wrapped__(value, "str")  # a long value: not kept
    return _forms_of(value, type(value).__name__)


# a value's forms are worked out once: one request's values are masked in each entry,
# card and line about it (keyed by type too: 1 and 1.0 are equal, and spelt apart)
_FORMS_KEPT = 4096


@functools.lru_cache(maxsize=1024)
def _forms_of(value: Any, kind: str) -> tuple[_Form, ...]:
    if isinstance(value, str):
        if is_mask(value):
            return ()  # masked already (a record masked when written)
        texts = {value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]}
    elif isinstance(value, int | float) and len(str(value).lstrip("-")) >= MIN_ANYWHERE:
        texts = {str(value), json.dumps(value)}
    else:
        return ()  # a small number is no secret worth masking every digit of the text for
    mask = str(mask_value(value))
    return tuple(_Form(t, mask, len(t) < MIN_ANYWHERE) for t in texts if t.strip())


@functools.lru_cache(maxsize=256)
def _word(text: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![0-9A-Za-z_]){re.escape(text)}(?![0-9A-Za-z_])")


def _common(text: str, at: int, form: str) -> int:
    """How many characters of ``form`` ``text`` holds from ``at`` on."""
    n = min(len(form), len(text) - at)
    if text.startswith(form[:n], at):
        return n
    lo, hi = 0, n  # text holds form[:lo] at ``at``, and not form[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text.startswith(form[:mid], at):
            lo = mid
        else:
            hi = mid
    return lo


class Masking:
    """What may be shown of a call (or of every call of a run): the values under its
    declared ``paths`` masked wherever they occur, in the arguments or in anything
    derived from them, and what the detectors find (see the module docstring).

    ``values``: the declared values (:func:`declared_values` of the call's arguments, as
    asked and as edited). ``detectors``: those of this process unless given."""

    __slots__ = ("_forms", "_grams", "_numbers", "_patterns", "detectors", "paths", "values")

    def __init__(self, paths: Iterable[str] = (), values: Iterable[Any] = (),
                 detectors: Detectors | None = None) -> None:
        self.paths = tuple(dict.fromkeys(p for p in paths if p))
        self.values = tuple(values)
        self.detectors = detectors
        self._patterns = _compile(self.paths)
        forms: dict[str, _Form] = {}
        numbers: set[int | float] = set()
        for v in self.values:
            found = _forms(v)
            if found and isinstance(v, int | float):
                numbers.add(v)
            for f in found:
                forms.setdefault(f.text, f)
        self._forms = tuple(sorted(forms.values(), key=lambda f: -len(f.text)))
        self._numbers = frozenset(numbers)
        # the runs of a value and their halves, built on first use by text()
        self._grams: tuple[frozenset[str], frozenset[str]] | None = None

    @classmethod
    def of_call(cls, paths: Iterable[str], *args: Any,
                detectors: Detectors | None = None) -> Masking:
        """The masking of one call: ``paths`` and the values ``args`` (its arguments as
        asked, as edited; None skipped) hold under them."""
        paths = tuple(paths)
        values = [v for a in args if a is not None for v in declared_values(a, paths)]
        return cls(paths, values, detectors)

    def __or__(self, other: Masking) -> Masking:
        """Both calls' paths and values (what a run's free text is masked with)."""
        if not other.paths and not other.values:
            return self
        return Masking((*self.paths, *other.paths), (*self.values, *other.values),
                       self.detectors or other.detectors)

    def _detectors(self) -> Detectors:
        return self.detectors or active()

    # -- what is masked ------------------------------------------------------------------
    def text(self, text: str) -> str:
        """``text`` with every declared value in it masked, then what the detectors find."""
        if self._forms and text:
            text = self._replace(text)
        return mask_text(text, self.detectors)  # (None: this process's, as _detectors says)

    def _shown(self) -> Callable[[str], str]:
        """:meth:`text`, as the walks call it for each string: with nothing declared, the
        detectors' :func:`mask_text` itself (one call per string, not two)."""
        if self._forms:
            return self.text
        if self.detectors is None:
            return mask_text
        return functools.partial(mask_text, detectors=self.detectors)

    def args(self, value: Any) -> Any:
        """A call's arguments: the values under the declared paths masked whole, every
        other string and number as :meth:`text` and :meth:`data` say."""
        return _walk(value, self._patterns, self._shown(), self._number)

    def data(self, value: Any) -> Any:
        """Any JSON-like value derived from the call (a result, an error, a packet):
        every string in it as :meth:`text` says."""
        return _data(value, self._shown(), self._number)

    def details(self, details: Mapping[str, Any]) -> dict[str, Any]:
        """A record about the call (an audit entry's details): the declared paths under
        each of :data:`ARGS_KEYS` (and the values found there masked everywhere else in
        it), what the detectors find anywhere; :data:`KEPT_KEYS` are the runtime's own
        words and only go through the detectors."""
        plain = _PLAIN if self.detectors is None else Masking(detectors=self.detectors)
        masked: dict[str, Any]
        kept = plain._shown()
        if not self.paths:  # nothing declared: every value as data (issue 50: no paths walked)
            text = self._shown()
            masked = {}
            for k, v in details.items():  # (a string, most values here, masked at once)
                if k in KEPT_KEYS:
                    masked[k] = kept(v) if type(v) is str else _data(v, kept, plain._number)
                else:
                    masked[k] = text(v) if type(v) is str else _data(v, text, self._number)
            every = self
        else:
            paths = [f"{key}.{p}" for p in self.paths for key in ARGS_KEYS]
            found = declared_values(details, paths)
            every = Masking(self.paths, (*self.values, *found), self.detectors) \
                if found else self
            patterns = _compile(paths)
            text = every._shown()
            masked = {
                k: _child(v, patterns, k, kept, plain._number) if k in KEPT_KEYS
                else _child(v, patterns, k, text, every._number)
                for k, v in details.items()}
        scope = masked.get("scope_value")
        if isinstance(masked.get("scope"), str) and scope != details.get("scope_value"):
            # a standing approval's scope in words quotes its values: told again, masked
            from approvald.runtime.policies.scope import Scope  # (scope -> rules -> … -> here)

            try:
                masked["scope"] = Scope.model_validate(scope).describe()
            except ValueError:
                masked["scope"] = every.text(masked["scope"])
        return masked

    def _number(self, value: int | float) -> Any:
        if value in self._numbers:
            return mask_value(value)
        if isinstance(value, int) and 13 <= len(str(value)) <= 19 \
                and "card" in self._detectors().on:
            shown = mask_text(str(value), self._detectors())
            return value if shown == str(value) else shown
        return value

    def _fragments(self, text: str) -> list[tuple[int, int, str]]:
        """Where ``text`` holds a run of :data:`FRAGMENT` characters of a declared value
        (a line of a file, a word of a command). Every such run holds, at a position that
        is a multiple of ``FRAGMENT // 2``, a piece of that length of the value: only those
        positions are looked up, and the runs around a piece found are checked whole."""
        if self._grams is None:
            sources = [f.text[:FRAGMENT_SOURCE] for f in self._forms if len(f.text) > FRAGMENT]
            self._grams = (
                frozenset(t[i:i + FRAGMENT] for t in sources
                          for i in range(len(t) - FRAGMENT + 1)),
                frozenset(t[i:i + _PIECE] for t in sources
                          for i in range(len(t) - _PIECE + 1)))
        runs, pieces = self._grams
        if not runs:
            return []
        found: set[int] = set()
        last = len(text) - FRAGMENT
        for i in range(0, len(text) - _PIECE + 1, _PIECE):
            if text[i:i + _PIECE] in pieces:
                found.update(j for j in range(max(0, i - _PIECE), min(i, last) + 1)
                             if text[j:j + FRAGMENT] in runs)
        return [(j, j + FRAGMENT, MASKED) for j in sorted(found)]

    def _replace(self, text: str) -> str:
        spans: list[tuple[int, int, str]] = []
        for f in self._forms:
            if f.word:
                spans += [(m.start(), m.end(), f.mask) for m in _word(f.text).finditer(text)]
                continue
            head = f.text[:CUT_MIN]
            at = text.find(head)
            while at >= 0:
                n = _common(text, at, f.text)
                end = at + n
                if n == len(f.text):
                    spans.append((at, end, f.mask))
                elif n >= CUT_MIN and (end == len(text) or text.startswith(ELLIPSIS, end)):
                    spans.append((at, end, MASKED))  # the start of a value cut off
                at = text.find(head, at + 1)
        spans += self._fragments(text)
        if not spans:
            return text
        spans.sort()
        kept: list[tuple[int, int, str]] = []
        for start, end, mask in spans:  # overlapping finds are masked as one
            if kept and start < kept[-1][1]:
                s, e, m = kept[-1]
                kept[-1] = (s, max(e, end), m if end <= e else MASKED)
            else:
                kept.append((start, end, mask))
        return spliced(text, kept)


def _walk(value: Any, live: Sequence[tuple[str, ...]], text: Callable[[str], str],
          number: Callable[[int | float], Any]) -> Any:
    """``value`` masked: under a path of ``live`` that ends, whole; every string by
    ``text``, every number by ``number``."""
    # the exact types JSON gives first (a str, a dict): the same branch as below, without
    # the ABC's isinstance check each value of each record would cost (issue 50)
    kind = type(value)
    if kind is str:
        return text(value)
    if kind is dict:
        return {k: _child(v, live, str(k), text, number) for k, v in value.items()}
    if isinstance(value, Mapping):
        return {k: _child(v, live, str(k), text, number) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_child(v, live, str(i), text, number) for i, v in enumerate(value)]
    if isinstance(value, str):
        return text(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return number(value)
    return value


def _data(value: Any, text: Callable[[str], str], number: Callable[[int | float], Any]) -> Any:
    """:func:`_walk` where no path is live (most of what is masked: results, packets, the
    details of a call that declared none), one call per value instead of two."""
    kind = type(value)
    if kind is str:
        return text(value)
    if kind is dict:
        return {k: _data(v, text, number) for k, v in value.items()}
    if kind is list:
        return [_data(v, text, number) for v in value]
    if kind is int or kind is float:
        return number(value)
    if value is None or kind is bool:
        return value
    return _walk(value, (), text, number)  # (another Mapping, a tuple, a subclass)


def _child(value: Any, live: Sequence[tuple[str, ...]], key: str,
           text: Callable[[str], str], number: Callable[[int | float], Any]) -> Any:
    if not live:
        return _data(value, text, number)
    below, hit = _step(live, key)
    return _whole(value) if hit else _walk(value, below, text, number)


def _whole(value: Any) -> Any:
    """A declared value masked whole (a request's are masked in each of its entries)."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return _whole_of(value, type(value).__name__)
    return mask_value(value)


@functools.lru_cache(maxsize=1024)
def _whole_of(value: Any, kind: str) -> Any:
    return mask_value(value)


_PLAIN = Masking()  # the detectors of this process, and nothing declared
