"""Who belongs to an approver group. The Slack bot resolves user groups; tests use a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from approvald.runtime.kernel.errors import ApprovaldError


class DirectoryError(ApprovaldError):
    """Group membership could not be looked up (the directory is down or refused)."""


class Directory(Protocol):
    async def members(self, group_id: str) -> frozenset[str]:
        """User ids in ``group_id``; raises :class:`DirectoryError` if unknown or unreachable."""
        ...


class StaticDirectory:
    """Membership from a mapping, e.g. the ``[groups]`` table of the policy file."""

    def __init__(self, groups: Mapping[str, Sequence[str]] | None = None) -> None:
        self._groups = {k: frozenset(v) for k, v in (groups or {}).items()}

    async def members(self, group_id: str) -> frozenset[str]:
        # an unlisted group has no members: safe (nobody gains authority by a typo)
        return self._groups.get(group_id, frozenset())


async def is_approver(directory: Directory, approvers: Sequence[str], user: str) -> bool:
    """Is ``user`` one of ``approvers`` ([] = anyone), directly or through a user group?
    :class:`DirectoryError` (naming the group) when a group's members cannot be read."""
    from approvald.runtime.policies.policy import is_group

    if not approvers or user in approvers:
        return True
    for group in (g for g in approvers if is_group(g)):
        try:
            members = await directory.members(group)
        except DirectoryError as exc:
            raise DirectoryError(f"cannot check membership of {group}: {exc}") from None
        if user in members:
            return True
    return False
