"""How the sandbox's guard reads ``Host`` and ``Origin`` values (its routes' behaviour is
tested against a real sandbox in tests/acceptance/test_sandbox_guard.py)."""

from __future__ import annotations

import pytest
from approvald.bot.sandbox.guard import Guard, _address, _split
from approvald.bot.sandbox.page import page_html


@pytest.mark.parametrize(("host", "parsed"), [
    ("127.0.0.1:8300", ("127.0.0.1", 8300)),
    ("LocalHost:8300", ("localhost", 8300)),
    ("[::1]:8300", ("[::1]", 8300)),
    ("127.0.0.1", ("127.0.0.1", 80)),  # a browser leaves out the default port
    ("[::1]", ("[::1]", 80)),
    ("", None), ("127.0.0.1:", None), ("[::1]x", None), (":8300", None),
    ("evil.example:8300@127.0.0.1", None), ("127.0.0.1:\uff18\uff13\uff10\uff10", None),
])
def test_host_values(host: str, parsed: tuple[str, int] | None) -> None:
    assert _split(host) == parsed


@pytest.mark.parametrize(("ip", "shown"), [
    ("127.0.0.1", "127.0.0.1"), ("::1", "[::1]"), ("::ffff:10.0.0.5", "10.0.0.5"),
    ("fe80::1%eth0", "[fe80::1]"),
])
def test_local_addresses_as_a_host_names_them(ip: str, shown: str) -> None:
    assert _address(ip) == shown


@pytest.mark.parametrize(("url", "same"), [
    ("http://127.0.0.1:8300", True),
    ("http://127.0.0.1:8300/?user=U_DANA", True),  # a Referer: the page, not the origin
    ("http://127.0.0.1:8301", False), ("https://127.0.0.1:8300", False),
    ("http://localhost:8300", False), ("null", False), ("http://evil.example", False),
    ("http://[::1", False),
])
def test_same_origin(url: str, same: bool) -> None:
    assert Guard._same(url, "http://127.0.0.1:8300") is same


def test_an_ipv6_and_a_default_port_origin() -> None:
    assert Guard._same("http://[::1]:8300", "http://[::1]:8300")
    assert Guard._same("http://127.0.0.1", "http://127.0.0.1:80")


def test_the_page_carries_only_a_url_safe_token() -> None:
    assert 'content="Ab-_9"' in page_html("Ab-_9")
    for bad in ("", 'x"><script>', "a b", "é"):
        with pytest.raises(ValueError, match="URL-safe"):
            page_html(bad)
