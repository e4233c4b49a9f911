"""Cards posted before bindings were keyed can still be clicked (issue 46 item 1).

Button values used to be ``"{approval_id}:{digest[:12]}.{HMAC(v2|id|nonce|digest)}"``:
the first 12 hex characters of the arguments' plain SHA-256 in clear. They are now
``"v2:{approval_id}:{binding[:12]}.{HMAC(v3|id|nonce|digest)}"``. A card already in the
channel when approvald was upgraded carries the old form: its click is verified against
the digest stored with the request, over signed HTTP, as before; a forged old-form value
is refused; an old-form card drawn before an edit is a stale card.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest
from approvald.bot.slack import cards
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel import binding

from tests.helpers import Rows
from tests.integration.slack_harness import CHANNEL, Harness, harness, settings_for, wait_for

SECRET = settings_for("http://x", "sqlite://", Path("x")).token_secret()


def old_value(approval_id: str, nonce: str, digest: str) -> str:
    """A button value as approvald drew it before bindings were keyed (its token keyed
    with the deployment's secret exactly as that version did)."""
    assert SECRET is not None
    key = hashlib.sha256(b"approvald-token-v1\x00" + SECRET.encode()).digest()
    mac = hmac.new(key, f"v2|{approval_id}|{nonce}|{digest}".encode(), hashlib.sha256).digest()
    mac_text = base64.urlsafe_b64encode(mac[:24]).decode().rstrip("=")
    return f"{approval_id}:{digest[:12]}.{mac_text}"


async def _status(h: Harness, approval_id: str, status: str) -> bool:
    return (await h.approval(approval_id)).status == status


async def test_a_card_posted_before_the_upgrade_can_still_be_clicked(
        db_url: str, tmp_path: Path) -> None:
    async with harness(db_url, tmp_path) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        card = await h.card(aid)
        a = await h.approval(aid)
        # the card drawn now: a v2 value, its token showing the binding, not the digest
        [value] = {e["value"] for b in card["blocks"] if b["type"] == "actions"
                   for e in b["elements"] if e.get("action_id") == cards.APPROVE}
        assert value.startswith(f"v2:{aid}:{binding.short(a.digest)}.")
        assert a.digest[:12] not in value
        # a forged old-form value (the right digest, a made-up HMAC) changes nothing
        forged = f"{aid}:{a.digest[:12]}.{'A' * 32}"
        await h.slack.click(cards.APPROVE, forged, user_id="U_ALICE", channel_id=CHANNEL,
                            message_ts=a.message_ts)
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"),
                              what="the refusal")
        assert said and (await h.approval(aid)).status == "pending"
        # the card posted before the upgrade, clicked now
        old = old_value(aid, a.token_nonce, a.digest)
        resp = await h.slack.click(cards.APPROVE, old, user_id="U_ALICE", channel_id=CHANNEL,
                                   message_ts=a.message_ts)
        assert resp.status == 200
        await wait_for(lambda: _status(h, aid, "approved"), what="the old card's approval")
        assert (await h.approval(aid)).decided_by == "U_ALICE"


async def test_an_old_card_drawn_before_an_edit_is_stale(db_url: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.issue_refund]\napprovers = ["U_ALICE", "U_BOB"]\n'
                      'edits = "propose"\n')
    async with harness(db_url, tmp_path, APPROVALD_POLICY_FILE=str(policy)) as h:
        paused = await h.pause_refund()
        [aid] = paused.approval_ids
        a = await h.approval(aid)
        old = old_value(aid, a.token_nonce, a.digest)
        edited = {**a.args_value(), "amount_cents": 100}
        await h.engine.decide(aid, actor=Actor("U_BOB", "slack"), verdict="edit", args=edited)
        await h.slack.click(cards.APPROVE, old, user_id="U_ALICE", channel_id=CHANNEL)
        said = await wait_for(lambda: h.emulator.ephemeral(CHANNEL, "U_ALICE"),
                              what="the stale card's reply")
        assert said and (await h.approval(aid)).status == "pending"
        refused = [e for e in await Rows.of(h.engine).audit(run_id=paused.run_id)
                   if e.action == "refused"]
        assert '"stale_card"' in refused[-1].details
        # and the card drawn now for the edited arguments approves them
        fresh = await h.approval(aid)
        await h.slack.click(cards.APPROVE, cards.button_value(aid, h.token(fresh)),
                            user_id="U_ALICE", channel_id=CHANNEL)
        await wait_for(lambda: _status(h, aid, "approved"), what="the approval")


@pytest.mark.parametrize("value", ["v2:", "v2:abc", "v2:v2:abc:def.ghi"])
def test_a_malformed_tagged_value_is_not_ours(value: str) -> None:
    with pytest.raises(ValueError):
        cards.parse_value(value)
