"""``approvald hook disable|enable|status claude-code``: the hook's kill switch, by form,
as an operator uses it (issue 45 item 12: `tokens revoke hook.claude-code` was the
switch, shut off every person's HTTP hook token too, and had no way back)."""

from __future__ import annotations

import json

from tests.helpers import Cli


def test_the_switch_goes_off_and_on_again_and_says_what_it_covers(cli: Cli) -> None:
    assert cli.ok("hook", "status", "claude-code").count(" on\n") == 2
    out = cli.ok("hook", "disable", "claude-code", "--http", "--reason", "incident 42")
    assert "http     OFF since" in out and "incident 42" in out, out
    assert "command  on" in out and "for every person's token" in out
    assert "approvald hook enable claude-code" in out
    out = cli.ok("hook", "disable", "claude-code")  # both, by default
    assert "command  OFF since" in out and "http     OFF since" in out, out
    out = cli.ok("hook", "enable", "claude-code", "--command")
    assert "command  on" in out and "http     OFF since" in out, out
    assert cli.ok("hook", "enable", "claude-code").count(" on\n") == 2
    trail = [json.loads(line) for line in cli.ok("audit", "export").splitlines()]
    switched = [(e["action"], e["details"]["form"]) for e in trail
                if e["action"] in ("face_disabled", "face_enabled")]
    assert switched == [("face_disabled", "http"), ("face_disabled", "command"),
                        ("face_enabled", "command"), ("face_enabled", "http")], switched
    assert all(e["actor"].startswith("cli:") for e in trail if e["action"] == "face_enabled")


def test_revoking_the_hooks_own_credential_is_refused_saying_what_to_do(cli: Cli) -> None:
    done = cli("tokens", "revoke", "hook.claude-code")
    assert done.returncode == 2, done
    assert "approvald hook disable claude-code" in done.stderr, done.stderr
    assert "approvald tokens revoke NAME" in done.stderr


def test_a_form_the_hook_does_not_have_is_a_usage_error(cli: Cli) -> None:
    done = cli("hook", "disable", "claude-code", "--command", "--http")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr, done.stderr
    done = cli("hook", "disable", "cursor")
    assert done.returncode == 2 and "invalid choice" in done.stderr, done.stderr
