"""Sensitive arguments, and the one funnel everything shown of a call goes through.

A value is sensitive when a path declared for its tool names it (the tool's
``sensitive=[...]``, plus what the operator's policy file adds), or when a detector
(:mod:`runtime.policies.detectors`) recognises it anywhere, declared or not.

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
any run of 12 characters or more taken from one (from its first 4 KB: a line of a file,
the part of a command that a tool's output echoes), and the start of a value cut off (at
least 8 characters of it, where the text ends or says it was cut with ``…``). Then the
detectors mask what they recognise. Masking is for what people and logs see; digests,
the stored call and what a tool receives are always the real arguments (invariant 19).
An approver's edit of a masked view is read back by :func:`unmask_edit`: a masked value
left as shown keeps the original.

Paths are dotted, relative to the arguments: ``card_number``, ``credentials.*``,
``payees.*.iban``; ``*`` stands for any key or list index, and a path names the whole
value under it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from approvald.runtime.policies.detectors import (
    DETECTOR_NAMES,
    DOT,
    ELLIPSIS,
    MASKED,
    Detectors,
    active,
    configure,
    iban_ok,
    luhn_ok,
    mask_text,
    mask_value,
)
from approvald.runtime.policies.masking import ARGS_KEYS, KEPT_KEYS, Masking, declared_values

__all__ = ["ARGS_KEYS", "DETECTOR_NAMES", "DOT", "ELLIPSIS", "KEPT_KEYS", "MASKED",
           "Detectors", "Masking", "active", "configure", "declared_values", "iban_ok",
           "is_masked", "luhn_ok", "mask_args", "mask_text", "mask_value", "masked_details",
           "masked_json", "normalize_path", "paths_text", "sensitive_of_snapshot",
           "unmask_edit"]


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
    if detectors is None:
        return _masking_of(tuple(sensitive_paths)).details(details)
    return Masking(sensitive_paths, detectors=detectors).details(details)


@functools.lru_cache(maxsize=256)
def _masking_of(paths: tuple[str, ...]) -> Masking:
    # a call's paths hold no values (those found are the record's own, each time): one
    # Masking per paths serves every record of a tool (issue 50: not made per entry)
    return Masking(paths)


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
