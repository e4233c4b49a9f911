"""Where decision webhooks may go: the hosts the operator allows (``APPROVALD_WEBHOOK_HOSTS``).

A webhook URL comes from whoever holds an API token (a request's ``webhook_url``, or the
token's default), and approvald POSTs to it from inside the operator's network. Unchecked,
that is a way to make approvald call the cloud metadata service, an internal admin port
or approvald itself. So:

* only a host the operator lists is called: ``hooks.example.com``, ``hooks.example.com:8443``
  (that port only), ``*.example.com`` (any name below it, not the name itself), an IP
  address (``127.0.0.1:8099``, ``[::1]:9000``). Nothing listed: no webhook at all;
* link-local addresses (where cloud metadata services live), the known metadata addresses
  elsewhere, and unspecified, multicast, broadcast and reserved addresses: never, whoever
  lists them;
* loopback and private (non-global) addresses only for a host named exactly, never through
  a wildcard (anyone who can add a DNS record under ``*.example.com`` could point it at
  them); and never approvald's own listener ports on loopback (or on the address it
  listens on).

A URL is checked when it is given (:meth:`WebhookHosts.check_url`; names are not resolved
then) and again when it is delivered, after DNS resolution: the connection may go only to
the addresses the name resolved to that pass (:meth:`WebhookHosts.addresses`), so a name
that resolves elsewhere by then (DNS rebinding) reaches nothing it should not.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from approvald.runtime.kernel.errors import ApprovaldError, ConfigError

SETTING = "APPROVALD_WEBHOOK_HOSTS"
MAX_URL = 2000
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# cloud metadata and platform services outside 169.254.0.0/16 (which is refused whole):
# AWS over IPv6 (metadata fd00:ec2::254, DNS, time), Alibaba Cloud, Oracle Cloud's legacy
# address, Azure's wire server
METADATA = tuple(ipaddress.ip_network(n) for n in (
    "fd00:ec2::/32", "100.100.100.200/32", "192.0.0.192/32", "168.63.129.16/32"))
NAT64 = ipaddress.ip_network("64:ff9b::/96")
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # Linux connects 0.x.x.x to this host
BROADCAST = ipaddress.ip_address("255.255.255.255")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


class WebhookRefused(ApprovaldError):
    """A webhook URL, or an address its host resolved to, that approvald will not call."""


@dataclass(frozen=True)
class HostEntry:
    """One entry of the setting: a host name (``wildcard``: the names below it) or an IP
    address, with the one port it allows (None: any)."""

    host: str
    port: int | None
    wildcard: bool = False

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        host = f"*.{self.host}" if self.wildcard else \
            f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


class WebhookHosts:
    """The operator's allowlist of webhook hosts, and approvald's own listener ports."""

    def __init__(self, entries: Iterable[HostEntry], *, own_ports: Iterable[int] = (),
                 own_host: str | None = None) -> None:
        self.entries = tuple(entries)
        self.own_ports = {p for p in own_ports if p}
        own = _ip(own_host) if own_host else None
        # a listener on one address is reachable there too (0.0.0.0 and :: are refused anyway)
        self._own_addresses = {own} if own is not None and not own.is_unspecified else set()

    @classmethod
    def from_setting(cls, text: str | None, *, own_ports: Iterable[int] = (),
                     own_host: str | None = None) -> WebhookHosts:
        """Parse ``APPROVALD_WEBHOOK_HOSTS`` (comma-separated); :class:`ConfigError` names
        the variable and the entry that is wrong."""
        entries = []
        for raw in (text or "").split(","):
            if raw.strip():
                try:
                    entries.append(_entry(raw.strip()))
                except ValueError as exc:
                    raise ConfigError(f"{SETTING}: {exc}") from None
        return cls(entries, own_ports=own_ports, own_host=own_host)

    def add_own_port(self, port: int) -> None:
        """A port approvald's ``serve`` listens on (known only once bound, with port 0)."""
        if port:
            self.own_ports.add(port)

    # -- when a URL is given ------------------------------------------------------------
    def check_url(self, url: str) -> str:
        """``url`` if a webhook may be sent there, else :class:`WebhookRefused` saying why.

        Its host must be listed; an IP address is classified here, a name only once it
        resolves (:meth:`addresses`, at delivery)."""
        host, port = self._target(url)
        ip = _ip(host)
        never = _never(_embedded(ip)) if ip is not None else None
        if never:  # whatever the list says
            raise WebhookRefused(f"webhook URL {_shown(url)}: {ip} is {never}: webhooks "
                                 "never go there")
        entry = self._entry_for(host, port)
        why = self._refusal(ip, port, exact=not entry.wildcard) if ip is not None else None
        if why:
            raise WebhookRefused(f"webhook URL {_shown(url)}: {why}")
        return url

    def _target(self, url: str) -> tuple[str, int]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_URL:
            raise WebhookRefused(f"a webhook URL is an absolute http:// or https:// URL of at "
                                 f"most {MAX_URL} characters: {_shown(url)}")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port is None:
            port = 443 if parts.scheme == "https" else 80
        elif not 1 <= port <= 65535:
            raise WebhookRefused(f"webhook URL {_shown(url)}: its port is not a number from "
                                 "1 to 65535")
        host = _host(parts.hostname)
        if host is None:
            raise WebhookRefused(f"webhook URL {_shown(url)}: {parts.hostname!r} is not a host "
                                 "name or an IP address in its usual form")
        return host, port

    def _entry_for(self, host: str, port: int) -> HostEntry:
        if not self.entries:
            raise WebhookRefused(f"no webhook host is allowed: {SETTING} is not set (the "
                                 "operator lists the hosts webhooks may go to, e.g. "
                                 f"{SETTING}=hooks.example.com)")
        exact = [e for e in self.entries if not e.wildcard and e.matches(host, port)]
        found = exact or [e for e in self.entries if e.wildcard and e.matches(host, port)]
        if not found:
            shown = f"[{host}]" if ":" in host else host
            raise WebhookRefused(f"{shown}:{port} is not in {SETTING} (the hosts the operator "
                                 "allows webhooks to go to)" if any(
                                     e.matches(host, e.port or port) for e in self.entries)
                                 else f"{shown} is not in {SETTING} (the hosts the operator "
                                      "allows webhooks to go to)")
        return found[0]

    # -- when it is delivered -----------------------------------------------------------
    def addresses(self, host: str, port: int, resolved: Iterable[str]
                  ) -> tuple[list[str], list[str]]:
        """Of the addresses ``host`` resolved to, those a webhook to ``host:port`` may
        connect to, and why each other one may not."""
        resolved = list(resolved)
        try:
            name = _host(host)
            if name is None:
                raise WebhookRefused(f"{host!r} is not a host name")
            entry = self._entry_for(name, port)
        except WebhookRefused as exc:
            return [], [str(exc)]
        kept, refused = [], []
        for address in resolved:
            ip = _ip(address)
            why = f"{address} is not an IP address" if ip is None else \
                self._refusal(ip, port, exact=not entry.wildcard)
            if why:
                refused.append(why)
            else:
                kept.append(address)
        return kept, refused

    # -- one address ----------------------------------------------------------------------
    def _refusal(self, ip: IPAddress, port: int, *, exact: bool) -> str | None:
        inner = _embedded(ip)
        why = _never(inner)
        if why:
            return f"{ip} is {why}: webhooks never go there"
        if (inner.is_loopback or inner in self._own_addresses) and port in self.own_ports:
            return f"{ip} is approvald's own listener (port {port})"
        if not exact and inner.is_loopback:
            return (f"{ip} is a loopback address, allowed only for a host named exactly "
                    f"in {SETTING}")
        if not exact and not inner.is_global:
            return (f"{ip} is a private address, allowed only for a host named exactly "
                    f"in {SETTING}")
        return None


def _never(ip: IPAddress) -> str | None:
    """Why no webhook may ever go to ``ip`` (None: it may, given the rest)."""
    if ip.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if any(ip in net for net in METADATA):
        return "a cloud metadata address"
    if ip.is_unspecified or ip in THIS_NETWORK:
        return "an unspecified address"
    if ip == BROADCAST:
        return "the broadcast address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_reserved and not ip.is_loopback:  # ::1 is in IPv6's reserved ::/8
        return "a reserved address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "a site-local address"
    return None


def _embedded(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4), which is where a
    connection to it ends up; else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _host(raw: str) -> str | None:
    """A URL's host, normalised (lower case, no trailing dot, punycode, an IP address in
    its canonical form); None when it is neither a host name nor an IP address: forms
    such as ``2130706433`` or ``127.1`` that resolvers read as addresses are refused."""
    host = raw.strip().lower().removesuffix(".")
    ip = _ip(host)
    if ip is not None:
        return str(ip)
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return None
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    if re.fullmatch(r"[0-9]+|0x[0-9a-f]*", labels[-1]):  # numbers end only addresses
        return None
    return host


def _entry(raw: str) -> HostEntry:
    text = raw.lower()
    port: int | None = None
    if text.startswith("["):  # [IPv6] or [IPv6]:port
        host, _, rest = text[1:].partition("]")
        if rest:
            port = _port(rest.removeprefix(":") if rest.startswith(":") else "?", raw)
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = _port(p, raw)
    else:  # a name, or an IPv6 address without a port
        host = text
    if host == "*":
        raise ValueError("'*' alone would allow every host: list the hosts (or *.domain)")
    wildcard = host.startswith("*.")
    name = _host(host.removeprefix("*.")) if host.removeprefix("*.") else None
    if name is None or (wildcard and _ip(name) is not None):
        raise ValueError(f"{raw!r} is not a host name, *.domain or IP address, with an "
                         "optional :port")
    ip = _ip(name)
    if ip is not None:
        why = _never(_embedded(ip))
        if why:
            raise ValueError(f"{raw!r} is {why}: webhooks never go there")
    return HostEntry(name, port, wildcard)


def _port(text: str, raw: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{raw!r} is not a host name, *.domain or IP address, with an "
                         "optional :port")
    if not 1 <= int(text) <= 65535:
        raise ValueError(f"{raw!r}: the port is a number from 1 to 65535")
    return int(text)


def _shown(url: str) -> str:
    return repr(url if len(url) <= 100 else url[:100] + "…")
