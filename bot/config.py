"""Settings: environment variables read once into one pydantic-settings object.

A missing or malformed setting stops start-up with one line naming the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import platformdirs
from approvald.runtime import AuditKey, ConfigError, DataKey, Detectors, Sealer, WebhookHosts
from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from approvald.bot.web.mail import SmtpTarget

DEFAULT_METRICS_ADDR = "127.0.0.1:9464"


def default_database_path() -> Path:
    """The embedded database when ``APPROVALD_DATABASE_URL`` is unset: one file per user
    (platformdirs' user data directory, e.g. ``~/.local/share/approvald/approvald.db``), so
    every command finds the same runs whatever directory it is started from."""
    return Path(platformdirs.user_data_dir("approvald", appauthor=False)) / "approvald.db"


def default_database_url() -> str:
    """A SQLite file in the user's data directory: ``approvald.db`` in
    ``$XDG_DATA_HOME/approvald``, else ``~/.local/share/approvald`` on Linux
    (``~/Library/Application Support/approvald`` on macOS)."""
    return f"sqlite+aiosqlite:///{default_database_path()}"


def _env(name: str) -> AliasChoices:
    return AliasChoices(name)


K = TypeVar("K")


def key_ring(current: SecretStr | None, retired: SecretStr | None,
             make: Callable[[str], K], retired_setting: str) -> list[K]:
    """A key ring: ``current`` first, then the comma-separated ``retired`` keys (each
    ``make`` refuses one shorter than 16 bytes, told by ``retired_setting``'s name)."""
    keys = [make(current.get_secret_value())] if current else []
    for raw in (retired.get_secret_value().split(",") if retired is not None else []):
        if raw.strip():
            try:
                keys.append(make(raw.strip()))
            except ConfigError:
                raise ConfigError(f"{retired_setting}: each key needs at least 16 bytes"
                                  ) from None
    return keys

class Settings(BaseSettings):
    """Every knob approvald reads from the environment."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore",
                                      populate_by_name=False)
    # read by load_settings (the environment and APPROVALD_SECRETS_DIR), so that keys can
    # be read again from there; settings built from values in code have nowhere to look
    _from_environment: bool = PrivateAttr(False)

    slack_bot_token: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_BOT_TOKEN"),
        description="the Slack app's bot token (xoxb-...); with the signing secret or the app "
                    "token, serve runs the Slack face")
    slack_signing_secret: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_SIGNING_SECRET"),
        description="the Slack app's signing secret: in HTTP mode, each request from Slack is "
                    "verified with it")
    slack_app_token: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_APP_TOKEN"),
        description="the Slack app-level token (xapp-...): when set, serve connects in Socket Mode"
                    " instead of HTTP mode")
    slack_api_url: str = Field(
        "https://slack.com/api/", validation_alias=_env("SLACK_API_URL"),
        description="the Slack Web API's base URL (an emulator's, in tests and the sandbox)")
    database_url: str = Field(
        default_factory=default_database_url, validation_alias=_env("APPROVALD_DATABASE_URL"),
        description="the database: a SQLite file (sqlite+aiosqlite:///PATH, or sqlite:///PATH) or "
                    "PostgreSQL (postgresql+asyncpg://USER@HOST/DB, or postgresql://...). Unset: "
                    "one SQLite file per user, the same for every command wherever it starts, "
                    "created with its directory on first use and its path printed then; a SQLite "
                    "file named here is created too, but its directory must exist")
    # PostgreSQL: the pooled connections each process keeps (wake-ups use 2 more). Few
    # is faster where replicas share few cores: 8 against 20 cut three replicas' p99
    # click -> tool start in 7 paired rounds of 7 (bench_replicas.py, issue 14)
    db_connections: int = Field(
        8, ge=2, le=1000, validation_alias=_env("APPROVALD_DB_CONNECTIONS"),
        description="PostgreSQL: the pooled connections each process keeps (wake-ups use 2 more); "
                    "a burst beyond it waits for a connection (up to 30 s) rather than opening "
                    "more, and N replicas hold N times as many, which the server's max_connections"
                    " must admit")
    db_fast_path: bool = Field(
        True, validation_alias=_env("APPROVALD_DB_FAST_PATH"),
        description="hot statements skip SQLAlchemy's per-statement machinery through the "
                    "drivers' private internals (store/private_*.py); 0: plain SQLAlchemy with "
                    "aiosqlite or asyncpg")
    channel: str | None = Field(
        None, validation_alias=_env("APPROVALD_CHANNEL"),
        description="the Slack channel approval cards are posted to")
    ops_channel: str | None = Field(
        None, validation_alias=_env("APPROVALD_OPS_CHANNEL"),
        description="the Slack channel run threads are posted to (unset: APPROVALD_CHANNEL)")
    # a caller's request (a hook's, the MCP gateway's, an HTTP API token's) posts its card
    # when a person is asked, and nothing else: a run thread per call was channel noise
    caller_threads: Literal["off", "asked"] = Field(
        "off", validation_alias=_env("APPROVALD_CALLER_THREADS"),
        description="run threads for callers' requests (Claude Code's hook, the MCP gateways, "
                    "HTTP API tokens, adapters): off, their card is their one message; asked, "
                    "a thread for each request that asked a person too. A call the policy "
                    "answers (auto, forbidden) never posts")
    # 0: any
    port: int = Field(
        3000, ge=0, le=65535, validation_alias=_env("APPROVALD_PORT"),
        description="the port of serve's HTTP listener: Slack events in HTTP mode, /healthz, "
                    "/readyz and the HTTP API (/v1); in Socket Mode or without Slack, that "
                    "listener is opened only when this is set. 0: any free port")
    host: str = Field(
        "0.0.0.0", validation_alias=_env("APPROVALD_HOST"),
        description="the address serve's HTTP listener binds")
    # /metrics on a listener of its own, off the one Slack and API callers reach:
    # "host:port" (port 0: any), or "off"
    metrics_addr: str = Field(
        DEFAULT_METRICS_ADDR, validation_alias=_env("APPROVALD_METRICS_ADDR"),
        description="where serve serves /metrics, on a listener of its own: host:port ([::1]:9464 "
                    "for IPv6; port 0: any), or off")
    # the hosts decision webhooks may go to (runtime/kernel/webhook_hosts.py); unset: none
    webhook_hosts: str | None = Field(
        None, validation_alias=_env("APPROVALD_WEBHOOK_HOSTS"),
        description="comma-separated hosts the HTTP API's decision webhooks may go to: name, "
                    "name:port, *.domain, an IP address (127.0.0.1:8099, [::1]:9000); unset: no "
                    "webhooks")
    # the Slack user each local user is, for `approvald hook claude-code` without
    # --requested-by (a project's shared .claude/settings.json names nobody)
    slack_users: str | None = Field(
        None, validation_alias=_env("APPROVALD_SLACK_USERS"),
        description="comma-separated local=SLACK_USER pairs (dana=U024BE7LH): who a "
                    "coding assistant's hook asks for, by the local user running it, when "
                    "the hook is given no --requested-by")
    # the web review queue and its mails (bot/web): on when the public URL is set
    public_url: str | None = Field(
        None, validation_alias=_env("APPROVALD_PUBLIC_URL"),
        description="the URL approvers reach serve's listener at (https://approvals.example.com"
                    "); when set, serve serves the web review queue at /review, mails sign-in "
                    "links pointing there, and refuses a POST whose Origin is not this URL's; "
                    "cookies are Secure when it is https")
    # before smtp_url: its validator reads it
    smtp_insecure_host: str | None = Field(
        None, validation_alias=_env("APPROVALD_SMTP_INSECURE_HOST"),
        description="DANGEROUS: the one host other than loopback that an smtp+insecure:// "
                    "APPROVALD_SMTP_URL may name. Everything sent there (the SMTP password, "
                    "sign-in links that sign their holder in as an approver, requests) "
                    "crosses the network in clear: only for a relay on a network nobody "
                    "else can read")
    smtp_url: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_SMTP_URL"),
        description="the SMTP server mails are sent through: smtp://[USER:PASSWORD@]HOST[:PORT]"
                    " (STARTTLS required: a server that does not offer it is sent nothing), "
                    "smtps://... (TLS from the start), or smtp+insecure://... (no TLS: to a "
                    "relay on loopback, or the host APPROVALD_SMTP_INSECURE_HOST names); the "
                    "server's certificate is checked against the system's trusted CAs "
                    "(SSL_CERT_FILE names others)")
    mail_from: str | None = Field(
        None, validation_alias=_env("APPROVALD_MAIL_FROM"),
        description="the From address of approvald's mails (approvals@example.com)")
    approver_emails: str | None = Field(
        None, validation_alias=_env("APPROVALD_APPROVER_EMAILS"),
        description="comma-separated SLACK_USER=ADDRESS pairs (U024BE7LH=ana@example.com): "
                    "the address each approver's sign-in links are mailed to; an address "
                    "not listed gets no link")
    mail_fallback_after: str | None = Field(
        None, validation_alias=_env("APPROVALD_MAIL_FALLBACK_AFTER"),
        description="a duration (90s, 15m, 1h): a request whose Slack card is still not "
                    "posted that long after it was made (Slack down, erroring, unreachable) "
                    "is mailed to its approvers, once, while it is open; unset: mailed only "
                    "when its card is given up. Needs APPROVALD_PUBLIC_URL, APPROVALD_SMTP_URL "
                    "and APPROVALD_MAIL_FROM")
    # Sign in with Slack on the review queue (Slack's OpenID Connect): on when both are set
    slack_client_id: str | None = Field(
        None, validation_alias=_env("APPROVALD_SLACK_CLIENT_ID"),
        description="the Slack app's client ID (Basic Information, App Credentials): with "
                    "APPROVALD_SLACK_CLIENT_SECRET and APPROVALD_PUBLIC_URL, the review "
                    "queue offers Sign in with Slack (OpenID Connect) beside the mailed link")
    slack_client_secret: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_SLACK_CLIENT_SECRET"),
        description="the Slack app's client secret, for Sign in with Slack (the code Slack "
                    "sends back is exchanged with it)")
    slack_team_id: str | None = Field(
        None, validation_alias=_env("APPROVALD_SLACK_TEAM_ID"),
        description="the workspace (T...) whose members may Sign in with Slack; unset: the "
                    "bot token's, as auth.test names it. Anyone signing in from another "
                    "workspace is refused")
    slack_authorize_url: str | None = Field(
        None, validation_alias=_env("SLACK_AUTHORIZE_URL"),
        description="where Sign in with Slack sends the browser to authorize (unset: "
                    "https://slack.com/openid/connect/authorize, or beside SLACK_API_URL's "
                    "/api/ when that points elsewhere, such as an emulator)")
    mcp_gateways_file: Path | None = Field(
        None, validation_alias=_env("APPROVALD_MCP_GATEWAYS_FILE"),
        description="a TOML file of MCP gateways serve mounts at /mcp/NAME over Streamable "
                    "HTTP, each in front of an MCP server it starts (command) or reaches "
                    "(url); see the MCP gateway guide")
    slack_fast_path: bool = Field(
        True, validation_alias=_env("APPROVALD_SLACK_FAST_PATH"),
        description="a card's chat.update or chat.postMessage goes out with its request built "
                    "once (the URL, the headers) through slack_sdk's private internals "
                    "(bot/slack/private_slack_sdk.py), the same bytes, retries and errors as "
                    "api_call's; 0: api_call builds every one")
    mcp_fast_path: bool = Field(
        True, validation_alias=_env("APPROVALD_MCP_FAST_PATH"),
        description="a 2025-era client's tools/call is answered by serve's handler, with the MCP "
                    "SDK's kernel but without its per-request transport machinery (the same "
                    "answer on the wire), and a gateway's stdio server is spoken to by the "
                    "SDK's session without its stdio transport's relay tasks (the same bytes "
                    "on the pipes); 0: the SDK's transports for both")
    policy_file: Path | None = Field(
        None, validation_alias=_env("APPROVALD_POLICY_FILE"),
        description="the TOML policy file: per-tool overrides of the policies declared in code, "
                    "rules on arguments, the default for tools nobody named, groups")
    agents: str | None = Field(
        None, validation_alias=_env("APPROVALD_AGENTS"),
        description="comma-separated modules whose Agent objects are loaded (importable from the "
                    "current directory, as with python -m)")
    demo_ledger: str | None = Field(
        None, validation_alias=_env("APPROVALD_DEMO_LEDGER"),
        description="a file where the demo tools append one JSON line per real side effect")
    secrets_dir: Path | None = Field(
        None, validation_alias=_env("APPROVALD_SECRETS_DIR"),
        description="a directory of files named after settings (APPROVALD_DATA_KEY, "
                    "APPROVALD_AUDIT_KEY, SLACK_BOT_TOKEN, ...), each holding that setting's "
                    "value, as Docker secrets, Kubernetes secret volumes and systemd's "
                    "LoadCredential= provide them; a variable set in the environment wins. "
                    "serve reads the keys there again on SIGHUP, and when it meets a value "
                    "sealed under a data key it lacks")
    secret: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_SECRET"),
        description="the key approval tokens are derived from (unset: the Slack signing secret, "
                    "else the app token); set it to rotate Slack secrets freely")
    # the audit chain's HMAC key: kept out of the database (see runtime/record/audit.py)
    audit_key: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_AUDIT_KEY"),
        description="the audit chain's HMAC key, kept out of the database (at least 16 bytes)")
    # comma-separated, retired
    audit_old_keys: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_AUDIT_OLD_KEYS"),
        description="comma-separated retired audit keys, so that audit verify can check the "
                    "entries written under them")
    # the key sensitive values are sealed at rest under (see runtime/record/sealing.py)
    data_key: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_DATA_KEY"),
        description="the key sensitive arguments are sealed at rest under (AES-256-GCM, at "
                    "least 16 bytes), kept out of the database")
    data_old_keys: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_DATA_OLD_KEYS"),
        description="comma-separated retired data keys, which still open what they sealed "
                    "until `approvald keys reseal` seals it again under APPROVALD_DATA_KEY")
    require_data_key: bool = Field(
        False, validation_alias=_env("APPROVALD_REQUIRE_DATA_KEY"),
        description="refuse to store a detected secret in clear when APPROVALD_DATA_KEY is "
                    "not set (unset: stored as given, with one warning)")
    audit_unkeyed_until: int = Field(
        0, ge=0, validation_alias=_env("APPROVALD_AUDIT_UNKEYED_UNTIL"),
        description="the last audit entry written before the deployment had a key (entries up to "
                    "it may be unkeyed)")
    operators: str | None = Field(
        None, validation_alias=_env("APPROVALD_OPERATORS"),
        description="comma-separated Slack user ids of the deployment's operators: they see "
                    "the insights (approvald insights: answers, waits, who decides, suggested "
                    "rules) in their App Home and on the web review queue")
    audit_channel: str | None = Field(
        None, validation_alias=_env("APPROVALD_AUDIT_CHANNEL"),
        description="the Slack channel serve posts the audit chain's head to (unset: not posted)")
    audit_head_interval: float = Field(
        3600.0, ge=60, le=7 * 86400, validation_alias=_env("APPROVALD_AUDIT_HEAD_INTERVAL"),
        description="seconds between two posts of the audit chain's head")
    # the longest any request (or rung of its ladder) may wait, policy file and callers alike
    secret_detectors_off: str | None = Field(
        None, validation_alias=_env("APPROVALD_SECRET_DETECTORS_OFF"),
        description="comma-separated detectors of secrets not to run (card, iban, private_key, "
                    "api_key): values they would recognise are then masked only where a tool "
                    "or the policy file declares them sensitive")
    max_ttl: str = Field(
        "30d", validation_alias=_env("APPROVALD_MAX_TTL"),
        description="the longest any request (or rung of its escalation ladder) may wait, whether "
                    "the policy file or an API caller asks for it: a duration such as 30m, 12h or "
                    "30d")
    # serve prunes finished runs older than this once a day (e.g. "90d"); unset: never
    prune_older_than: str | None = Field(
        None, validation_alias=_env("APPROVALD_PRUNE_OLDER_THAN"),
        description="when set (e.g. 90d, at least 1d), serve runs approvald prune --older-than "
                    "with it every 24 hours, the first time 24 hours after it starts")
    lease_ttl: float = Field(
        30.0, gt=0, le=3600, validation_alias=_env("APPROVALD_LEASE_TTL"),
        description="seconds a worker's lease on a run lasts without renewal")
    max_payload: int = Field(
        256 * 1024, ge=1024, le=64 * 1024 * 1024, validation_alias=_env("APPROVALD_MAX_PAYLOAD"),
        description="the byte cap on a task, on tool arguments and on a tool result")
    poll_interval: float = Field(
        2.0, gt=0, le=600, validation_alias=_env("APPROVALD_POLL_INTERVAL"),
        description="seconds between two polls for runs ready to advance; on PostgreSQL "
                    "with several replicas, the one leading polls at this rate and the "
                    "others five times slower (wake-ups reach every replica at once)")
    sweep_interval: float = Field(
        15.0, gt=0, le=3600, validation_alias=_env("APPROVALD_SWEEP_INTERVAL"),
        description="seconds between two expiry sweeps (expire, escalate, remind)")
    log_level: str = Field(
        "INFO", validation_alias=_env("APPROVALD_LOG_LEVEL"),
        description="DEBUG, INFO, WARNING or ERROR; commands other than serve log only warnings "
                    "unless it is DEBUG, which also prints an internal error's traceback")
    # serve's event loop: uvloop (a dependency wherever it builds: not on Windows, nor
    # outside CPython) runs about a fifth fewer Python calls per request than asyncio's
    # own loop (a time saving is not shown on the benchmark VM: docs/performance.md)
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto", validation_alias=_env("APPROVALD_EVENT_LOOP"),
        description="the event loop serve runs on: auto, uvloop where it is installed (it is "
                    "a dependency on Linux and macOS) and asyncio's own otherwise; uvloop, "
                    "uvloop or a configuration error; asyncio, asyncio's own loop")
    # how long `serve` lets in-flight runs reach a step boundary after SIGTERM/SIGINT;
    # a tool call still running then is cut off (the ledger makes it outcome-unknown)
    shutdown_grace: float = Field(
        30.0, ge=0, le=3600, validation_alias=_env("APPROVALD_SHUTDOWN_GRACE"),
        description="seconds serve gives in-flight runs to reach a step boundary after SIGTERM or "
                    "SIGINT before cutting them off")
    # testing hook: time read from this file (see runtime.kernel.clock.FileClock)
    clock_file: str | None = Field(
        None, validation_alias=_env("APPROVALD_CLOCK_FILE"),
        description="testing hook: time is read from this file, which holds an ISO-8601 instant "
                    "with a time zone, so that tests move time across processes instead of "
                    "sleeping")

    @field_validator("slack_api_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return v if v.endswith("/") else v + "/"

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return v

    @field_validator("metrics_addr")
    @classmethod
    def _metrics_addr(cls, v: str) -> str:
        v = v.strip()
        if v.lower() == "off":
            return "off"
        parse_listen_addr(v)
        return v

    @field_validator("webhook_hosts")
    @classmethod
    def _webhook_hosts(cls, v: str | None) -> str | None:
        try:
            WebhookHosts.from_setting(v)
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("APPROVALD_WEBHOOK_HOSTS: ")) from None
        return v

    @property
    def metrics_listen(self) -> tuple[str, int] | None:
        """Where ``serve`` serves ``/metrics`` (host, port), or None when it is off."""
        return None if self.metrics_addr == "off" else parse_listen_addr(self.metrics_addr)

    def webhook_allowlist(self) -> WebhookHosts:
        """APPROVALD_WEBHOOK_HOSTS, knowing the ports this deployment listens on as set
        (``serve`` adds the ones it binds when they are 0)."""
        metrics = self.metrics_listen
        return WebhookHosts.from_setting(
            self.webhook_hosts, own_ports=(self.port, metrics[1] if metrics else 0),
            own_host=self.host)

    def slack_user_of(self, local: str) -> str | None:
        """The Slack user APPROVALD_SLACK_USERS maps ``local`` to, or None."""
        return self._slack_users().get(local)

    def _slack_users(self) -> dict[str, str]:
        from approvald.runtime import normalize_user_id

        pairs: dict[str, str] = {}
        for item in (self.slack_users or "").split(","):
            if item.strip():
                local, _, user = item.partition("=")
                pairs[local.strip()] = normalize_user_id(user)
        return pairs

    @field_validator("slack_users")
    @classmethod
    def _slack_users_pairs(cls, v: str | None) -> str | None:
        from approvald.runtime import InvalidIdentity, normalize_user_id

        for item in (v or "").split(","):
            if not item.strip():
                continue
            local, eq, user = item.partition("=")
            if not eq or not local.strip():
                raise ValueError(f"expected local=SLACK_USER pairs, got {item.strip()!r}")
            try:
                normalize_user_id(user)
            except InvalidIdentity as exc:
                raise ValueError(f"{local.strip()}: {exc}") from None
        return v

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(v.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname \
                or parts.query or parts.fragment:
            raise ValueError("must be an http(s) URL such as https://approvals.example.com")
        return v.strip().rstrip("/")

    @field_validator("slack_authorize_url")
    @classmethod
    def _authorize_url(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if not v.strip().startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return v.strip()

    @field_validator("slack_team_id")
    @classmethod
    def _team_id(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if not re.fullmatch(r"[TE][A-Z0-9_]{1,30}", v.strip()):
            raise ValueError("must be a workspace ID such as T024BE7LD")
        return v.strip()

    @property
    def slack_sign_in(self) -> bool:
        """Whether the review queue offers Sign in with Slack (client ID and secret set)."""
        return bool(self.slack_client_id and self.slack_client_secret
                    and self.slack_client_secret.get_secret_value())

    def slack_authorize_endpoint(self) -> str:
        """Where Sign in with Slack sends the browser: SLACK_AUTHORIZE_URL, else beside the
        Web API's base URL (slack.com's, or an emulator's)."""
        if self.slack_authorize_url:
            return self.slack_authorize_url
        base = self.slack_api_url.rstrip("/")
        root = base.removesuffix("/api") if base.endswith("/api") else base
        return f"{root}/openid/connect/authorize"

    @field_validator("smtp_insecure_host")
    @classmethod
    def _insecure_host(cls, v: str | None) -> str | None:
        return v.strip() if v is not None and v.strip() else None

    @field_validator("smtp_url")
    @classmethod
    def _smtp_url(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if v is not None:
            from approvald.bot.web.mail import SmtpTarget

            SmtpTarget.parse(v.get_secret_value(),
                             insecure_host=info.data.get("smtp_insecure_host"))
        return v

    def smtp_target(self) -> SmtpTarget | None:
        """Where mails go (``APPROVALD_SMTP_URL``), or None when it is unset."""
        if self.smtp_url is None:
            return None
        from approvald.bot.web.mail import SmtpTarget

        return SmtpTarget.parse(self.smtp_url.get_secret_value(),
                                insecure_host=self.smtp_insecure_host)

    @field_validator("mail_from")
    @classmethod
    def _mail_from(cls, v: str | None) -> str | None:
        if v is not None and not _EMAIL.fullmatch(v.strip()):
            raise ValueError("must be an address such as approvals@example.com")
        return v.strip() if v else None

    @field_validator("approver_emails")
    @classmethod
    def _approver_emails(cls, v: str | None) -> str | None:
        parse_emails(v)
        return v

    def emails(self) -> dict[str, str]:
        """APPROVALD_APPROVER_EMAILS as {Slack user: address}."""
        return parse_emails(self.approver_emails)

    @property
    def slack_configured(self) -> bool:
        return any((self.slack_bot_token, self.slack_signing_secret, self.slack_app_token))

    @field_validator("prune_older_than")
    @classmethod
    def _prune_horizon(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from approvald.runtime import MIN_HORIZON, parse_duration
        if parse_duration(v) < MIN_HORIZON:
            raise ValueError("must be at least 1d")
        return v

    @field_validator("mail_fallback_after")
    @classmethod
    def _mail_fallback_after(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from approvald.runtime import parse_duration
        parse_duration(v)  # a ValueError for anything not a positive duration
        return v

    def mail_fallback_after_value(self) -> timedelta | None:
        """How long a card may stay unposted before its request is mailed (None: off)."""
        from approvald.runtime import parse_duration
        return parse_duration(self.mail_fallback_after) if self.mail_fallback_after else None

    @field_validator("secret_detectors_off")
    @classmethod
    def _detectors(cls, v: str | None) -> str | None:
        Detectors.from_setting(v)  # an unknown name is a ValueError naming it
        return v

    def detectors(self) -> Detectors:
        """The detectors of secrets this deployment runs."""
        return Detectors.from_setting(self.secret_detectors_off)

    @field_validator("max_ttl")
    @classmethod
    def _max_ttl(cls, v: str) -> str:
        from approvald.runtime import parse_duration
        parse_duration(v)
        return v

    def max_ttl_value(self) -> timedelta:
        from approvald.runtime import parse_duration
        return parse_duration(self.max_ttl)

    @field_validator("secret")
    @classmethod
    def _secret_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        # blank is not "unset" (which falls back to a Slack secret): it would key every
        # button and sign-in link with spaces
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("is empty: set a secret of at least 16 characters, or unset "
                             "the variable")
        return v

    @field_validator("audit_key", "data_key")
    @classmethod
    def _long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        # set and empty (or blank) is a mistake, not "no key": a blank key would seal
        # everything under a key anyone can guess, and an empty one is easily meant as unset
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("is empty: set a key of at least 16 bytes, or unset the variable")
        if v is not None and len(v.get_secret_value().encode()) < 16:
            raise ValueError("a key needs at least 16 bytes")
        return v

    def operator_ids(self) -> frozenset[str]:
        """``APPROVALD_OPERATORS`` as a set of Slack user ids."""
        return frozenset(u.strip() for u in (self.operators or "").split(",") if u.strip())

    def audit_keys(self) -> list[AuditKey]:
        """The current audit key first, then the retired ones (for ``audit verify``)."""
        return key_ring(self.audit_key, self.audit_old_keys, AuditKey,
                        "APPROVALD_AUDIT_OLD_KEYS")

    def data_keys(self) -> list[DataKey]:
        """The current data key first, then the retired ones (which still open)."""
        return key_ring(self.data_key, self.data_old_keys, DataKey, "APPROVALD_DATA_OLD_KEYS")

    def sealer(self) -> Sealer:
        """How this deployment seals sensitive values at rest; settings read from the
        environment give it the way to read its keys again (see :func:`reread_data_keys`)."""
        return Sealer(self.data_keys(), require=self.require_data_key,
                      reread=reread_data_keys if self._from_environment else None)

    def token_secret(self) -> str | None:
        """The key approval tokens are derived from (APPROVALD_SECRET, else a Slack secret)."""
        for s in (self.secret, self.slack_signing_secret, self.slack_app_token):
            if s is not None and s.get_secret_value():
                return s.get_secret_value()
        return None


_EMAIL = re.compile(r"[^@\s,<>\"]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}")


def parse_emails(text: str | None) -> dict[str, str]:
    """``U1=a@x.com,U2=b@y.org`` as {user: address}; ValueError naming a bad pair."""
    from approvald.runtime import InvalidIdentity, normalize_user_id

    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        user, eq, address = item.partition("=")
        address = address.strip()
        if not eq or not _EMAIL.fullmatch(address):
            raise ValueError(f"expected SLACK_USER=ADDRESS pairs, got {item.strip()!r}")
        try:
            out[normalize_user_id(user)] = address
        except InvalidIdentity as exc:
            raise ValueError(f"{user.strip()}: {exc}") from None
    return out


def parse_listen_addr(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6; port 0: any) as (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]") if host.startswith("[") else host
    if not sep or not host or (":" in host and not text.startswith("[")) \
            or not port.isdigit() or int(port) > 65535:
        raise ValueError("must be host:port ([::1]:9464 for IPv6; port 0: any) or off")
    return host, int(port)


_ALIASES = {name: (f.validation_alias.choices[0] if isinstance(f.validation_alias, AliasChoices)
                   else name).__str__() for name, f in Settings.model_fields.items()}


# the secret settings, by field name and by variable name (a validation error names either)
_SECRETS = frozenset(n for name, f in Settings.model_fields.items()
                     if "SecretStr" in str(f.annotation) for n in (name, _ALIASES[name]))


def load_settings() -> Settings:
    """Read the environment (and the files of ``APPROVALD_SECRETS_DIR``); raise
    :class:`ConfigError` naming the first bad variable."""
    where = os.environ.get("APPROVALD_SECRETS_DIR", "").strip()
    if where and not Path(where).expanduser().is_dir():
        raise ConfigError(f"APPROVALD_SECRETS_DIR: {where} is not a directory")
    try:
        settings = Settings(_secrets_dir=Path(where).expanduser() if where else None)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = str(err["loc"][0]) if err["loc"] else "environment"
        var = _ALIASES.get(loc, loc)
        got = err.get("input")
        # a secret's value is never echoed, not even a malformed one
        shown = f" (got {got!r})" if isinstance(got, str | int | float) \
            and loc not in _SECRETS and var not in _SECRETS else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{var}: {msg}{shown}") from None
    settings._from_environment = True
    return settings


def reread_data_keys() -> list[DataKey]:
    """The data keys as the environment and ``APPROVALD_SECRETS_DIR`` give them now (a
    running process's environment never changes: the files may)."""
    return load_settings().data_keys()
