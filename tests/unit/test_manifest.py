"""manifest.yml is a valid Slack app manifest that declares what the app really uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from jsonschema import Draft7Validator
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "tests" / "fixtures" / "slack_manifest"  # Slack's published schema (MIT)


def _validator() -> Draft7Validator:
    registry: Registry = Registry()
    for version in ("1.0.0", "2.0.0"):
        resource = Resource.from_contents(
            json.loads((SCHEMAS / f"manifest.schema.{version}.json").read_text()))
        for tag in ("main", "v0.5.0"):
            registry = registry.with_resource(
                "https://raw.githubusercontent.com/slackapi/manifest-schema/"
                f"{tag}/schemas/manifest.schema.{version}.json", resource)
    root = json.loads((SCHEMAS / "manifest.schema.json").read_text())
    return Draft7Validator(root, registry=registry)


def manifest() -> dict:
    return yaml.safe_load((ROOT / "manifest.yml").read_text())


def test_manifest_validates_against_slacks_schema() -> None:
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}"
              for e in _validator().iter_errors(manifest())]
    assert errors == []


def test_manifest_matches_what_the_app_does() -> None:
    from approvald.bot.slack import cards

    m = manifest()
    scopes = set(m["oauth_config"]["scopes"]["bot"])
    assert {"chat:write", "commands", "users:read", "usergroups:read"} <= scopes
    assert m["settings"]["socket_mode_enabled"] is True
    assert m["settings"]["interactivity"]["is_enabled"] is True
    assert m["settings"]["event_subscriptions"]["bot_events"] == ["app_home_opened"]
    assert [c["command"] for c in m["features"]["slash_commands"]] == ["/approvals"]
    assert m["features"]["app_home"]["home_tab_enabled"] is True
    for url in (m["settings"]["interactivity"]["request_url"],
                m["settings"]["event_subscriptions"]["request_url"]):
        assert url.endswith("/slack/events")  # the route bot.app serves
    assert cards.APPROVE.startswith("approvald.")


def test_the_sign_in_with_slack_lines_validate_once_uncommented() -> None:
    from approvald.bot.web.slack_sign_in import CALLBACK, SCOPES

    marked = re.compile(r"^(\s*)# (redirect_urls:|  - https://\S+|user:|  - (openid|profile"
                        r"|email))(\s+#.*)?$")
    text = "\n".join(marked.sub(r"\1\2", line)
                     for line in (ROOT / "manifest.yml").read_text().splitlines())
    m = yaml.safe_load(text)
    assert [f"{'/'.join(map(str, e.path))}: {e.message}"
            for e in _validator().iter_errors(m)] == []
    [url] = m["oauth_config"]["redirect_urls"]
    assert url.endswith(CALLBACK)
    assert m["oauth_config"]["scopes"]["user"] == SCOPES.split()
    assert "chat:write" in m["oauth_config"]["scopes"]["bot"]


def test_a_broken_manifest_is_caught() -> None:
    m = manifest()
    m["settings"]["socket_mode_enabled"] = "yes"
    del m["display_information"]["name"]
    assert list(_validator().iter_errors(m))
