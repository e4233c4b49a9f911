"""Sensitive arguments, and the one funnel everything shown of a call goes through.

A value is sensitive when a path declared for its tool names it (the tool's
``sensitive=[...]``, plus what the operator's policy file adds), or when a detector
(:mod:`runtime.detectors`) recognises it anywhere, declared or not.

:class:`Masking` is what may be shown of one call (or of every call of a run): the
declared paths and the values found under them, with the detectors. Everything the
runtime derives from a call's arguments goes through it where the runtime produces or
records the value (a request's decision packet, the audit log's details, a trace, the
CLI's documents, what every face draws), so a declared value is masked in the text
derived from it as well as in the arguments themselves (issue 46): the Claude Code
hook's "doing" text quotes the command it gates; a tool's result may echo its input.

The rule for text: a declared value (a string, or a number of 4 digits or more) is
replaced by its mask wherever it occurs, as written or JSON-escaped; a value shorter than
4 characters only where it stands as a word of its own. Parts of a value are masked too:
any run of 12 characters or more taken from one (a line of a file, the part of a command
that a tool's output echoes), and the start of a value cut off (at least 8 characters of
it, where the text ends or says it was cut with ``…``). Then the detectors mask what
they recognise. Masking is for what people and
logs see; digests, the stored call and what a tool receives are always the real
arguments (invariant 19). An approver's edit of a masked view is read back by
:func:`unmask_edit`: a masked value left as shown keeps the original.

Paths are dotted, relative to the arguments: ``card_number``, ``credentials.*``,
``payees.*.iban``; ``*`` stands for any key or list index, and a path names the whole
value under it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from approvald.runtime.detectors import (
    DETECTOR_NAMES,
    DOT,
    ELLIPSIS,
    MASKED,
    Detectors,
    active,
    configure,
    iban_ok,
    is_mask,
    luhn_ok,
    mask_text,
    mask_value,
)

__all__ = ["ARGS_KEYS", "DETECTOR_NAMES", "DOT", "ELLIPSIS", "MASKED", "Detectors",
           "Masking", "active", "configure", "declared_values", "iban_ok", "is_masked",
           "luhn_ok", "mask_args", "mask_text", "mask_value", "masked_details",
           "masked_json", "normalize_path", "paths_text", "sensitive_of_snapshot",
           "unmask_edit"]

MIN_ANYWHERE = 4  # a declared value this long is masked wherever it occurs
CUT_MIN = 8  # characters of a cut-off declared value's start that are masked
FRAGMENT = 12  # a run of this many characters of a declared value is masked anywhere
FRAGMENT_SOURCE = 65536  # characters of each declared value its runs are taken from

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


# -- paths -----------------------------------------------------------------------------------

def normalize_path(path: str, *, prefix: bool = False) -> str:
    """A sensitive path as stored (``card_number``, ``credentials.*``). ``prefix``: it is
    written ``args.…`` (the policy file's form, like its rules'). A ValueError says why."""
    text = path.strip()
    if prefix:
        if not text.startswith("args."):
            raise ValueError(f"a sensitive path starts with 'args.' (e.g. 'args.card_number'), "
                             f"got {path!r}")
        text = text.removeprefix("args.")
    else:
        text = text.removeprefix("args.")
    parts = text.split(".")
    if not text or any(not p or p != p.strip() for p in parts):
        raise ValueError(f"not a path of argument fields: {path!r}")
    return text


def _compile(paths: Iterable[str]) -> list[tuple[str, ...]]:
    return [tuple(p.split(".")) for p in paths if p]


def _covered(at: tuple[str, ...], patterns: Sequence[tuple[str, ...]]) -> bool:
    return any(len(p) <= len(at) and all(s in ("*", a) for s, a in zip(p, at, strict=False))
               for p in patterns)


def declared_values(args: Any, paths: Iterable[str]) -> list[Any]:
    """The scalars (strings and numbers) ``args`` holds under the declared ``paths``."""
    patterns = _compile(paths)
    out: list[Any] = []
    if patterns:
        _collect(args, (), patterns, out)
    return out


def _collect(value: Any, at: tuple[str, ...], patterns: Sequence[tuple[str, ...]],
             out: list[Any]) -> None:
    if at and _covered(at, patterns):
        _leaves(value, out)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _collect(v, (*at, str(k)), patterns, out)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _collect(v, (*at, str(i)), patterns, out)


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


def _forms(value: Any) -> list[_Form]:
    if isinstance(value, str):
        if is_mask(value):
            return []  # masked already (a record masked when written)
        texts = {value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]}
    elif isinstance(value, int | float) and len(str(value).lstrip("-")) >= MIN_ANYWHERE:
        texts = {str(value), json.dumps(value)}
    else:
        return []  # a small number is no secret worth masking every digit of the text for
    mask = str(mask_value(value))
    return [_Form(t, mask, len(t) < MIN_ANYWHERE) for t in texts if t.strip()]


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
        self._grams = frozenset(
            f.text[i:i + FRAGMENT] for f in self._forms if len(f.text) > FRAGMENT
            for i in range(min(len(f.text), FRAGMENT_SOURCE) - FRAGMENT + 1))

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
        return mask_text(text, self._detectors())

    def args(self, value: Any) -> Any:
        """A call's arguments: the values under the declared paths masked whole, every
        other string and number as :meth:`text` and :meth:`data` say."""
        return _walk(value, (), self._patterns, self.text, self._number)

    def data(self, value: Any) -> Any:
        """Any JSON-like value derived from the call (a result, an error, a packet):
        every string in it as :meth:`text` says."""
        return _walk(value, (), [], self.text, self._number)

    def details(self, details: Mapping[str, Any]) -> dict[str, Any]:
        """A record about the call (an audit entry's details): the declared paths under
        each of :data:`ARGS_KEYS` (and the values found there masked everywhere else in
        it), what the detectors find anywhere; :data:`KEPT_KEYS` are the runtime's own
        words and only go through the detectors."""
        paths = [f"{key}.{p}" for p in self.paths for key in ARGS_KEYS]
        every = self | Masking(self.paths, declared_values(details, paths))
        patterns = _compile(paths)
        plain = Masking(detectors=self.detectors)
        masked: dict[str, Any] = {
            k: _walk(v, (k,), patterns, plain.text, plain._number) if k in KEPT_KEYS
            else _walk(v, (k,), patterns, every.text, every._number)
            for k, v in details.items()}
        scope = masked.get("scope_value")
        if isinstance(masked.get("scope"), str) and scope != details.get("scope_value"):
            # a standing approval's scope in words quotes its values: told again, masked
            from approvald.runtime.scope import Scope  # (scope -> rules -> … -> here)

            try:
                masked["scope"] = Scope.model_validate(scope).describe()
            except ValueError:
                masked["scope"] = every.text(masked["scope"])
        return masked

    def _number(self, value: int | float) -> Any:
        if value in self._numbers:
            return mask_value(value)
        if isinstance(value, int) and "card" in self._detectors().on \
                and 13 <= len(str(value)) <= 19:
            shown = mask_text(str(value), self._detectors())
            return value if shown == str(value) else shown
        return value

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
        if self._grams:  # a part of a value: a line of a file, a word of a command
            grams = self._grams
            spans += [(i, i + FRAGMENT, MASKED) for i in range(len(text) - FRAGMENT + 1)
                      if text[i:i + FRAGMENT] in grams]
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
        out, pos = [], 0
        for start, end, mask in kept:
            out += [text[pos:start], mask]
            pos = end
        out.append(text[pos:])
        return "".join(out)


def _walk(value: Any, at: tuple[str, ...], patterns: Sequence[tuple[str, ...]],
          text: Callable[[str], str], number: Callable[[int | float], Any]) -> Any:
    if at and _covered(at, patterns):
        return mask_value(value)
    if isinstance(value, Mapping):
        return {k: _walk(v, (*at, str(k)), patterns, text, number) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, (*at, str(i)), patterns, text, number) for i, v in enumerate(value)]
    if isinstance(value, str):
        return text(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return number(value)
    return value


# -- the arguments as a person sees them -------------------------------------------------------

def mask_args(args: Any, sensitive_paths: Iterable[str] = (),
              detectors: Detectors | None = None) -> Any:
    """A masked copy of ``args``: each value under a sensitive path in its masked form,
    and every string (or number) elsewhere with the declared values and what the
    detectors find masked in it (:meth:`Masking.args`)."""
    return Masking.of_call(sensitive_paths, args, detectors=detectors).args(args)


def unmask_edit(edited: Any, original: Any, sensitive_paths: Iterable[str] = (),
                detectors: Detectors | None = None) -> Any:
    """An approver's edit of the masked view of ``original`` as arguments: wherever the
    edit left a masked value exactly as it was shown, the original value; everything the
    approver typed, as typed."""
    shown = mask_args(original, sensitive_paths, detectors)
    return _restore(edited, shown, original)


def _restore(edited: Any, shown: Any, original: Any) -> Any:
    if shown != original and edited == shown:
        return original
    if isinstance(edited, dict) and isinstance(shown, dict) and isinstance(original, dict):
        return {k: _restore(v, shown[k], original[k]) if k in shown and k in original else v
                for k, v in edited.items()}
    if isinstance(edited, list) and isinstance(shown, list) and isinstance(original, list):
        return [_restore(v, shown[i], original[i]) if i < len(shown) and i < len(original)
                else v for i, v in enumerate(edited)]
    return edited


def masked_json(raw: str, sensitive_paths: Iterable[str] = ()) -> tuple[Any, bool]:
    """The JSON text ``raw`` parsed and masked (as :func:`mask_args`), and whether anything
    in it is masked; a ValueError when it is not JSON. Remembered by text, paths and
    detectors: a card is drawn several times from the same stored text (posted, updated,
    quoted in its thread). The value is shared: callers must not change it."""
    return _masked_json(raw, tuple(sensitive_paths), active())


@functools.lru_cache(maxsize=512)
def _masked_json(raw: str, sensitive_paths: tuple[str, ...],
                 detectors: Detectors) -> tuple[Any, bool]:
    value = json.loads(raw)
    shown = mask_args(value, sensitive_paths, detectors)
    return shown, shown != value


def is_masked(args: Any, sensitive_paths: Iterable[str] = (),
              detectors: Detectors | None = None) -> bool:
    """Whether anything in ``args`` is shown masked."""
    return bool(mask_args(args, sensitive_paths, detectors) != args)


def masked_details(details: Mapping[str, Any], sensitive_paths: Iterable[str] = (),
                   detectors: Detectors | None = None) -> dict[str, Any]:
    """A record about a call (audit details, say) masked: :meth:`Masking.details` of the
    call's ``sensitive_paths``."""
    return Masking(sensitive_paths, detectors=detectors).details(details)


def paths_text(paths: Iterable[str]) -> str | None:
    """Declared paths as a ledger row or a request records them (None: none)."""
    listed = list(dict.fromkeys(paths))
    return json.dumps(listed) if listed else None


def sensitive_of_snapshot(snapshot: str | Mapping[str, Any] | None) -> tuple[str, ...]:
    """The sensitive paths a stored policy snapshot (its JSON text, or the dict) names;
    () for a snapshot written before there were any, or one that cannot be read."""
    if isinstance(snapshot, str):
        return _paths_of_text(snapshot)
    return _paths_of(snapshot)


@functools.lru_cache(maxsize=256)
def _paths_of_text(snapshot: str) -> tuple[str, ...]:
    # requests of one tool share one snapshot text; a card reads it several times
    if '"sensitive"' not in snapshot:
        return ()
    try:
        return _paths_of(json.loads(snapshot))
    except ValueError:
        return ()


def _paths_of(data: Any) -> tuple[str, ...]:
    paths = data.get("sensitive") if isinstance(data, Mapping) else None
    return tuple(p for p in paths if isinstance(p, str)) if isinstance(paths, list) else ()
