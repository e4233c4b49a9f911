"""What a command's parser needs, and nothing a command runs: the usage error, the parser
types of the command groups' arguments, and the type of the ``subparsers`` a group's
``register`` adds to. Cheap to import, so ``approvald --help`` and the hook's process
build their parsers without importing the engine (:mod:`.common` re-exports these)."""

from __future__ import annotations

import argparse
import math
from typing import TypeAlias

from approvald.runtime import ApprovaldError

# the ``sub`` a group's ``register`` adds its commands to
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(ApprovaldError):
    pass


def slack_user(flag: str, value: str) -> str:
    """The Slack user id a flag names, upper-cased; anything else is a usage error (exit 2)."""
    from approvald.runtime import InvalidIdentity, normalize_user_id

    try:
        return normalize_user_id(value)
    except InvalidIdentity as exc:
        raise UsageError(f"{flag}: {exc}") from None


def count(text: str) -> int:
    """A ``--limit``: a whole number of 1 or more."""
    return _whole(text, 1, None, "a whole number of 1 or more")


def port(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    return _whole(text, 0, 65535, "a port from 0 to 65535")


def _whole(text: str, low: int, high: int | None, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"must be {what} (got {text!r})")
    return value


def seconds(text: str) -> float:
    """A duration in seconds: 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more "
                                         f"(got {text!r})")
    return value
