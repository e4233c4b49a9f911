"""The docs' emulator walk-through (docs/tutorials/slack.md, once the README's), as a reader
pastes it: its curl reaches the emulator."""

from __future__ import annotations

import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from approvald.bot.sandbox import SlackEmulator
from approvald.bot.sandbox.server import seed_defaults

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "slack.md"


def readme_curl() -> tuple[str, str]:
    """The page's ``SLACK_API_URL`` value and its curl command (continuation lines joined)."""
    text = PAGE.read_text(encoding="utf-8")
    api_url = re.search(r"^export SLACK_API_URL=(\S+)", text, re.MULTILINE)
    curl = re.search(r"^curl .*?conversations\.history.*?$", text.replace("\\\n", " "),
                     re.MULTILINE)
    assert api_url and curl, "docs/tutorials/slack.md lost its emulator curl example"
    return api_url.group(1), curl.group(0)


def curl_arguments(api_url: str, command: str) -> list[str]:
    """What the shell hands curl when the page's command runs with SLACK_API_URL set."""
    script = f"curl() {{ printf '%s\\n' \"$@\"; }}\nSLACK_API_URL={api_url}\n{command}\n"
    done = subprocess.run(["bash", "-c", script], text=True, capture_output=True,
                          timeout=30, check=True)
    return done.stdout.splitlines()


@pytest.fixture
async def emulator() -> AsyncIterator[SlackEmulator]:
    emu = SlackEmulator()
    seed_defaults(emu)  # the workspace `approvald sandbox --slack-only` serves
    await emu.start()
    yield emu
    await emu.stop()


@pytest.mark.slow  # starts a process
async def test_the_readme_curl_reads_the_channel_from_the_emulator(
        emulator: SlackEmulator) -> None:
    readme_url, command = readme_curl()
    # the page's value, pointed at this emulator's port (its path kept as written)
    api_url = re.sub(r"^https?://[^/]+/", emulator.root_url, readme_url)
    args = curl_arguments(api_url, command)
    [url] = [a for a in args if a.startswith("http")]
    headers = dict(args[i + 1].split(": ", 1) for i, a in enumerate(args) if a == "-H")
    channel = re.search(r"channel=(\w+)", url)
    assert channel, url
    emulator.add_message(channel.group(1), "the card", user="U_ALICE")
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        assert resp.status == 200, (url, await resp.text())
        body = await resp.json()
    assert body["ok"] is True, body
    assert [m["text"] for m in body["messages"]] == ["the card"]


async def test_a_double_slash_is_answered_in_slacks_shape(emulator: SlackEmulator) -> None:
    url = emulator.base_url + "/conversations.history?channel=C1"  # ".../api//conversations…"
    async with aiohttp.ClientSession() as http, http.get(
            url, headers={"Authorization": "Bearer xoxb-test"}) as resp:
        assert resp.status == 404
        body = await resp.json()
    assert body["ok"] is False and body["error"] == "unknown_method"
    assert "SLACK_API_URL ends in /api/" in body["detail"]
