"""APPROVALD_WEBHOOK_HOSTS (issue 36, defect 10): webhooks go only to hosts the operator
allows; link-local and cloud metadata addresses never, loopback and private ones only for
a host named exactly, and never approvald's own listener."""

from __future__ import annotations

import pytest
from approvald.runtime.kernel.errors import ApprovaldError, ConfigError
from approvald.runtime.kernel.webhook_hosts import WebhookHosts, WebhookRefused

SETTING = "hooks.example.com, *.ci.example:8443, 127.0.0.1:8099, localhost, [::1]:9000, 10.1.2.3"


def hosts(text: str | None = SETTING, own: tuple[int, ...] = (3000, 9464)) -> WebhookHosts:
    return WebhookHosts.from_setting(text, own_ports=own)


def refused(h: WebhookHosts, url: str) -> str:
    with pytest.raises(WebhookRefused) as exc:
        h.check_url(url)
    assert isinstance(exc.value, ApprovaldError)
    return str(exc.value)


@pytest.mark.parametrize("url", [
    "https://hooks.example.com/approvald",
    "http://hooks.example.com:8080/x",  # an entry without a port allows any port
    "https://HOOKS.Example.com./x",  # case and a trailing dot do not matter
    "https://build.ci.example:8443/hook",
    "https://a.b.ci.example:8443/hook",  # the wildcard covers every depth below it
    "http://127.0.0.1:8099/hook",  # a loopback receiver named exactly, with its port
    "http://[::1]:9000/hook",
    "http://10.1.2.3/hook",  # a private address named exactly
])
def test_allowed_urls_pass_unchanged(url: str) -> None:
    assert hosts().check_url(url) == url


def test_nothing_is_allowed_until_the_operator_names_hosts() -> None:
    for text in (None, "", " , "):
        why = refused(hosts(text), "https://hooks.example.com/approvald")
        assert "APPROVALD_WEBHOOK_HOSTS" in why and "no webhook host" in why


@pytest.mark.parametrize(("url", "words"), [
    ("https://evil.example.net/x", "not in APPROVALD_WEBHOOK_HOSTS"),
    ("https://ci.example:8443/x", "not in APPROVALD_WEBHOOK_HOSTS"),  # *. is subdomains
    ("https://build.ci.example/x", "not in APPROVALD_WEBHOOK_HOSTS"),  # wrong port
    ("http://127.0.0.1:8100/x", "not in APPROVALD_WEBHOOK_HOSTS"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
    ("http://100.100.100.200/latest/meta-data/", "metadata"),
    ("http://[::ffff:169.254.169.254]/", "link-local"),  # IPv4-mapped IPv6
    ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),  # NAT64 of 169.254.169.254
    ("http://[fe80::1]/", "link-local"),
    ("http://0.0.0.0:8099/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://255.255.255.255/", "broadcast"),
    ("http://2130706433/", "not a host name"),  # 127.0.0.1 in disguise
    ("http://127.1:8099/", "not a host name"),
    ("ftp://hooks.example.com/x", "http:// or https://"),
    ("hooks.example.com/x", "http:// or https://"),
    ("https://hooks.example.com:99999/x", "port"),
])
def test_refused_urls_say_why(url: str, words: str) -> None:
    assert words in refused(hosts(), url)


def test_never_approvalds_own_listener_on_loopback() -> None:
    h = hosts("127.0.0.1, localhost, [::1]", own=(3000,))
    assert "approvald's own listener" in refused(h, "http://127.0.0.1:3000/slack/events")
    assert "approvald's own listener" in refused(h, "http://[::1]:3000/x")
    h.add_own_port(41234)  # a port serve bound at start (APPROVALD_PORT=0)
    assert "approvald's own listener" in refused(h, "http://127.0.0.1:41234/v1/requests")
    assert h.check_url("http://127.0.0.1:41235/hook")
    # a name is checked after it resolves (see addresses()): at delivery
    assert h.addresses("localhost", 3000, ["127.0.0.1"]) == ([], [
        "127.0.0.1 is approvald's own listener (port 3000)"])


def test_resolved_addresses_are_filtered_by_what_the_entry_allows() -> None:
    h = hosts()
    # an exact name may resolve to a private or loopback address the operator meant
    assert h.addresses("hooks.example.com", 443, ["203.0.113.7", "10.0.0.8"]) == (
        ["203.0.113.7", "10.0.0.8"], [])
    # a wildcard's names reach only public addresses: anyone who can add a DNS record
    # under it must not reach this host's loopback or the private network
    kept, why = h.addresses("build.ci.example", 8443, ["93.184.216.34", "127.0.0.1",
                                                      "192.168.1.10", "169.254.169.254"])
    assert kept == ["93.184.216.34"]
    assert [w.split(" ", 1)[1] for w in why] == [
        "is a loopback address, allowed only for a host named exactly in "
        "APPROVALD_WEBHOOK_HOSTS",
        "is a private address, allowed only for a host named exactly in "
        "APPROVALD_WEBHOOK_HOSTS",
        "is a link-local address (cloud metadata lives there): webhooks never go there"]
    # link-local and metadata addresses never, whatever names them
    assert h.addresses("hooks.example.com", 443, ["169.254.169.254", "fd00:ec2::254"])[0] == []
    assert h.addresses("hooks.example.com", 443, ["fe80::1%eth0"])[0] == []
    # a name the list does not hold resolves to nothing usable
    assert h.addresses("evil.example.net", 443, ["93.184.216.34"])[0] == []


@pytest.mark.parametrize(("text", "words"), [
    ("*", "'*' alone"),
    ("*.", "not a host name"),
    ("hooks..example.com", "not a host name"),
    ("hooks.example.com:0", "port"),
    ("hooks.example.com:http", "port"),
    ("169.254.169.254", "link-local"),
    ("[fd00:ec2::254]", "metadata"),
    ("*.10.0.0.1", "not a host name"),
    ("https://hooks.example.com", "not a host name"),
])
def test_a_malformed_setting_names_the_variable(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        WebhookHosts.from_setting(text)
    assert str(exc.value).startswith("APPROVALD_WEBHOOK_HOSTS: ") and words in str(exc.value)
