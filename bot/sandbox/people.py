"""Who and what the sandbox workspace starts with: every user the README's examples name
(and a stranger), the approvers' group, the channels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from approvald.bot.sandbox.server import SlackEmulator

CHANNEL = "C_APPROVALS"
AUDIT_CHANNEL = "C_AUDIT"  # where serve posts the audit chain's head


@dataclass(frozen=True)
class Person:
    """Someone in the sandbox workspace, and the part they play in the demo."""

    id: str
    name: str
    real_name: str
    role: str


PEOPLE = (
    Person("U_DANA", "dana", "Dana Requester",
           "asks for refunds; in @finance, but may not approve her own request"),
    Person("U_ALICE", "alice", "Alice Approver", "an approver named in the policy"),
    Person("U_BOB", "bob", "Bob Finance", "in @finance, the approvers' group"),
    Person("U_CAROL", "carol", "Carol Finance", "in @finance, the approvers' group"),
    Person("U_CFO", "cfo", "Casey CFO", "approves what escalates after 30 minutes"),
    Person("U_EVE", "eve", "Eve Stranger", "no part in any policy: every click is refused"),
)
#: group id -> (handle, members); the sandbox policy (policy.toml) names the same members
GROUPS = {"S_FINANCE": ("finance", ["U_BOB", "U_CAROL", "U_DANA"])}
CHANNELS = {CHANNEL: "approvals", AUDIT_CHANNEL: "approvald-audit", "C_FINANCE": "finance",
            "C_GENERAL": "general"}


def seed(emulator: SlackEmulator) -> None:
    """Fill an empty emulator with :data:`CHANNELS`, :data:`PEOPLE` and :data:`GROUPS`."""
    for channel_id, name in CHANNELS.items():
        emulator.add_channel(channel_id, name)
    for p in PEOPLE:
        emulator.add_user(p.id, p.name, p.real_name, email=f"{p.name}@example.com")
    for group_id, (handle, members) in GROUPS.items():
        emulator.add_usergroup(group_id, members, handle=handle)
