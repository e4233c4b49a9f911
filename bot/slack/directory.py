"""User-group membership from Slack (usergroups.users.list), cached briefly."""

from __future__ import annotations

import asyncio
import time

from approvald.bot.slack.delivery import slack_error
from approvald.runtime import DirectoryError
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient


class SlackDirectory:
    """Resolves ``S…`` approver groups; a failed lookup refuses the click, never grants it."""

    def __init__(self, client: AsyncWebClient, *, ttl: float = 60.0,
                 timeout: float = 2.0) -> None:
        self.client = client
        self.ttl = ttl
        # a click is acknowledged only after its decision commits, and Slack waits 3 s:
        # a lookup slower than this refuses the click (try again) rather than time it out
        self.timeout = timeout
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}

    async def members(self, group_id: str) -> frozenset[str]:
        hit = self._cache.get(group_id)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        try:
            async with asyncio.timeout(self.timeout):
                resp = await self.client.usergroups_users_list(usergroup=group_id)
        except TimeoutError:
            raise DirectoryError(f"Slack did not answer within {self.timeout:g} s") from None
        except SlackApiError as exc:
            error = slack_error(exc)
            if error == "no_such_subteam":
                members: frozenset[str] = frozenset()
            else:
                raise DirectoryError(f"Slack said {error or exc}") from None
        except Exception as exc:  # network trouble: refuse, do not guess
            raise DirectoryError(f"{type(exc).__name__}: {exc}") from None
        else:
            members = frozenset(resp.get("users") or [])
        self._cache[group_id] = (time.monotonic(), members)
        return members
