"""Ids people type (``--as``, ``--requested-by``, approvers) become Slack's form or nothing."""

from __future__ import annotations

import pytest
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.runtime.kernel.identity import (
    InvalidIdentity,
    normalize_approver,
    normalize_group_id,
    normalize_user_id,
)


@pytest.mark.parametrize("raw,user_id", [
    ("U024BE7LH", "U024BE7LH"),
    ("W012A3CDE", "W012A3CDE"),  # Enterprise Grid users
    ("U_ALICE", "U_ALICE"),  # the test workspace's ids
    ("u_dana", "U_DANA"),  # the same person as U_DANA: self-approval must see it
    ("  U_ALICE\n", "U_ALICE"),
    ("<@U024BE7LH>", "U024BE7LH"),  # pasted from a message
    ("<@U024BE7LH|dana>", "U024BE7LH"),
    (" <@u_alice|Alice Smith> ", "U_ALICE"),
    ("U12", "U12"),  # shortest: U and two characters
    ("U" + "A" * 30, "U" + "A" * 30),  # longest
])
def test_user_ids_are_normalised(raw: str, user_id: str) -> None:
    assert normalize_user_id(raw) == user_id
    assert normalize_approver(raw) == user_id


@pytest.mark.parametrize("raw", [
    "", "   ", "\t\n",
    "<!channel>", "<!here>", "<!everyone>", "@channel",
    "<@>", "<@|dana>", "<@U024BE7LH", "<#C024BE7LH>",
    "u dana", "U_DA NA", "dana", "alice@example.com", "cli:dana",
    "U1", "U", "U" + "A" * 31,
    "C024BE7LH", "S_FINANCE", "B024BE7LH",  # a channel, a user group, a bot
    "U-ALICE", "U.ALICE", "U_AL\u0130CE", "u_a\u017f",  # non-ASCII must not upper-case into an id
])
def test_anything_else_is_not_a_user_id(raw: str) -> None:
    with pytest.raises(InvalidIdentity) as err:
        normalize_user_id(raw)
    message = str(err.value)
    assert "is not a Slack user id (expected U… or W…, e.g. U024BE7LH)" in message
    assert message.startswith(repr(raw)) or len(raw) > 60
    assert "\n" not in message


def test_the_message_quotes_the_value_on_one_line() -> None:
    with pytest.raises(InvalidIdentity) as err:
        normalize_user_id("u dana")
    assert str(err.value) == (
        "'u dana' is not a Slack user id (expected U… or W…, e.g. U024BE7LH)")
    assert isinstance(err.value, ApprovaldError)  # the CLI's one-line error path
    with pytest.raises(InvalidIdentity) as err:
        normalize_user_id("x" * 500 + "\n<!channel>")
    assert len(str(err.value)) < 160 and "\n" not in str(err.value)


@pytest.mark.parametrize("raw,group_id", [
    ("S0614TZR7", "S0614TZR7"),
    ("S_FINANCE", "S_FINANCE"),
    ("s_finance ", "S_FINANCE"),
    ("<!subteam^S0614TZR7>", "S0614TZR7"),
    ("<!subteam^S0614TZR7|@finance>", "S0614TZR7"),
])
def test_group_ids_are_normalised(raw: str, group_id: str) -> None:
    assert normalize_group_id(raw) == group_id
    assert normalize_approver(raw) == group_id


@pytest.mark.parametrize("raw", ["", "finance", "@finance", "U_ALICE", "<@S0614TZR7>",
                                 "<!channel>", "S", "S1", "S-FIN"])
def test_anything_else_is_not_a_group_id(raw: str) -> None:
    with pytest.raises(InvalidIdentity, match="is not a Slack user-group id"):
        normalize_group_id(raw)


@pytest.mark.parametrize("raw", ["", "  ", "<!channel>", "finance", "C024BE7LH", "U1",
                                 "cli:dana"])
def test_an_approver_is_a_user_or_a_group(raw: str) -> None:
    with pytest.raises(InvalidIdentity, match="is not a Slack user or user-group id"):
        normalize_approver(raw)
