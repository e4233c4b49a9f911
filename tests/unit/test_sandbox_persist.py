"""The sandbox workspace file: a round trip keeps everything a restart needs; a damaged
file is refused with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from approvald.bot.sandbox.people import seed
from approvald.bot.sandbox.persist import WorkspaceFile, WorkspaceFileError, dump, load
from approvald.bot.sandbox.request import Params
from approvald.bot.sandbox.server import SlackEmulator
from approvald.bot.sandbox.workspace import workspace_path


def test_a_saved_workspace_comes_back_whole(tmp_path: Path) -> None:
    before = SlackEmulator()
    seed(before)
    posted = before.api.call("chat.postMessage", Params({
        "channel": "C_APPROVALS", "text": "card",
        "blocks": json.dumps([{"type": "section", "text": {"type": "mrkdwn", "text": "*x*"}}])}))
    before.api.call("chat.postMessage", Params({"channel": "C_APPROVALS", "text": "reply",
                                                "thread_ts": posted["ts"]}))
    before.api.call("chat.postEphemeral", Params({"channel": "C_APPROVALS", "user": "U_EVE",
                                                  "text": "not you"}))
    before.api.call("views.publish", Params({"user_id": "U_ALICE", "view": json.dumps(
        {"type": "home", "blocks": []})}))
    file = WorkspaceFile(tmp_path / "w.json")
    file.write(dump(before.state, {"secret": "s3cret"}))

    after = SlackEmulator()
    stored = file.read()
    assert stored is not None
    assert load(after.state, stored) == {"secret": "s3cret"}
    assert after.messages("C_APPROVALS") == before.messages("C_APPROVALS")
    assert after.message("C_APPROVALS", posted["ts"])["reply_count"] == 1  # type: ignore[index]
    assert after.ephemeral("C_APPROVALS", "U_EVE") == before.ephemeral("C_APPROVALS", "U_EVE")
    assert after.home_view("U_ALICE") == before.home_view("U_ALICE")
    assert after.state.usergroups["S_FINANCE"].users == ["U_BOB", "U_CAROL", "U_DANA"]
    # new stamps and view ids follow the old ones: nothing is issued twice
    later = after.api.call("chat.postMessage", Params({"channel": "C_APPROVALS", "text": "n"}))
    assert float(later["ts"]) > max(float(m["ts"]) for m in before.messages("C_APPROVALS"))
    assert after.state.new_view_id() not in before.state.views


@pytest.mark.parametrize("text", ["{not json", "[]", '{"format": 99}',
                                  '{"format": 1, "channels": 3}'])
def test_a_damaged_workspace_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "w.json"
    path.write_text(text)
    with pytest.raises(WorkspaceFileError):
        stored = WorkspaceFile(path).read()
        assert stored is not None
        load(SlackEmulator().state, stored)
    assert path.read_text() == text  # left as it was, for a person to look at


def test_no_file_yet_reads_as_none_and_the_path_follows_the_database(tmp_path: Path) -> None:
    assert WorkspaceFile(tmp_path / "absent.json").read() is None
    assert workspace_path(f"sqlite+aiosqlite:///{tmp_path}/a.db") == tmp_path / "a.db.sandbox.json"
    assert workspace_path(f"sqlite:///{tmp_path}/b.db") == tmp_path / "b.db.sandbox.json"
    assert workspace_path("postgresql+asyncpg://u@h/db") is None
