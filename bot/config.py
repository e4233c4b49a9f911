"""Settings: environment variables read once into one pydantic-settings object.

A missing or malformed setting stops start-up with one line naming the variable.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import platformdirs
from approvald.runtime.audit import AuditKey
from approvald.runtime.errors import ConfigError
from approvald.runtime.webhook_hosts import WebhookHosts
from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_METRICS_ADDR = "127.0.0.1:9464"


def default_database_path() -> Path:
    """The embedded database when ``APPROVALD_DATABASE_URL`` is unset: one file per user
    (platformdirs' user data directory, e.g. ``~/.local/share/approvald/approvald.db``), so
    every command finds the same runs whatever directory it is started from."""
    return Path(platformdirs.user_data_dir("approvald", appauthor=False)) / "approvald.db"


def default_database_url() -> str:
    return f"sqlite+aiosqlite:///{default_database_path()}"


def _env(name: str) -> AliasChoices:
    return AliasChoices(name)


class Settings(BaseSettings):
    """Every knob approvald reads from the environment."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore",
                                      populate_by_name=False)

    slack_bot_token: SecretStr | None = Field(None, validation_alias=_env("SLACK_BOT_TOKEN"))
    slack_signing_secret: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_SIGNING_SECRET"))
    slack_app_token: SecretStr | None = Field(None, validation_alias=_env("SLACK_APP_TOKEN"))
    slack_api_url: str = Field("https://slack.com/api/", validation_alias=_env("SLACK_API_URL"))
    database_url: str = Field(default_factory=default_database_url,
                              validation_alias=_env("APPROVALD_DATABASE_URL"))
    # PostgreSQL: the pooled connections each process keeps (wake-ups use 2 more). Few
    # is faster where replicas share few cores: 8 against 20 cut three replicas' p99
    # click -> tool start in 7 paired rounds of 7 (BENCHMARKS.md, replicas)
    db_connections: int = Field(8, ge=2, le=1000,
                                validation_alias=_env("APPROVALD_DB_CONNECTIONS"))
    # hot statements skip SQLAlchemy's per-statement machinery through the drivers'
    # private internals (store/private_*.py); off: plain SQLAlchemy + aiosqlite/asyncpg
    db_fast_path: bool = Field(True, validation_alias=_env("APPROVALD_DB_FAST_PATH"))
    channel: str | None = Field(None, validation_alias=_env("APPROVALD_CHANNEL"))
    ops_channel: str | None = Field(None, validation_alias=_env("APPROVALD_OPS_CHANNEL"))
    port: int = Field(3000, ge=0, le=65535, validation_alias=_env("APPROVALD_PORT"))  # 0: any
    host: str = Field("0.0.0.0", validation_alias=_env("APPROVALD_HOST"))
    # /metrics on a listener of its own, off the one Slack and API callers reach:
    # "host:port" (port 0: any), or "off"
    metrics_addr: str = Field(DEFAULT_METRICS_ADDR,
                              validation_alias=_env("APPROVALD_METRICS_ADDR"))
    # the hosts decision webhooks may go to (runtime/webhook_hosts.py); unset: none
    webhook_hosts: str | None = Field(None, validation_alias=_env("APPROVALD_WEBHOOK_HOSTS"))
    policy_file: Path | None = Field(None, validation_alias=_env("APPROVALD_POLICY_FILE"))
    agents: str | None = Field(None, validation_alias=_env("APPROVALD_AGENTS"))
    demo_ledger: str | None = Field(None, validation_alias=_env("APPROVALD_DEMO_LEDGER"))
    secret: SecretStr | None = Field(None, validation_alias=_env("APPROVALD_SECRET"))
    # the audit chain's HMAC key: kept out of the database (see runtime/audit.py)
    audit_key: SecretStr | None = Field(None, validation_alias=_env("APPROVALD_AUDIT_KEY"))
    audit_old_keys: SecretStr | None = Field(
        None, validation_alias=_env("APPROVALD_AUDIT_OLD_KEYS"))  # comma-separated, retired
    audit_unkeyed_until: int = Field(0, ge=0,
                                     validation_alias=_env("APPROVALD_AUDIT_UNKEYED_UNTIL"))
    audit_channel: str | None = Field(None, validation_alias=_env("APPROVALD_AUDIT_CHANNEL"))
    audit_head_interval: float = Field(3600.0, ge=60, le=7 * 86400,
                                       validation_alias=_env("APPROVALD_AUDIT_HEAD_INTERVAL"))
    # the longest any request (or rung of its ladder) may wait, policy file and callers alike
    max_ttl: str = Field("30d", validation_alias=_env("APPROVALD_MAX_TTL"))
    # serve prunes finished runs older than this once a day (e.g. "90d"); unset: never
    prune_older_than: str | None = Field(None,
                                         validation_alias=_env("APPROVALD_PRUNE_OLDER_THAN"))
    lease_ttl: float = Field(30.0, gt=0, le=3600, validation_alias=_env("APPROVALD_LEASE_TTL"))
    max_payload: int = Field(256 * 1024, ge=1024, le=64 * 1024 * 1024,
                             validation_alias=_env("APPROVALD_MAX_PAYLOAD"))
    poll_interval: float = Field(2.0, gt=0, le=600,
                                 validation_alias=_env("APPROVALD_POLL_INTERVAL"))
    sweep_interval: float = Field(15.0, gt=0, le=3600,
                                  validation_alias=_env("APPROVALD_SWEEP_INTERVAL"))
    log_level: str = Field("INFO", validation_alias=_env("APPROVALD_LOG_LEVEL"))
    # how long `serve` lets in-flight runs reach a step boundary after SIGTERM/SIGINT;
    # a tool call still running then is cut off (the ledger makes it outcome-unknown)
    shutdown_grace: float = Field(30.0, ge=0, le=3600,
                                  validation_alias=_env("APPROVALD_SHUTDOWN_GRACE"))
    # testing hook: time read from this file (see runtime.clock.FileClock)
    clock_file: str | None = Field(None, validation_alias=_env("APPROVALD_CLOCK_FILE"))

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

    @property
    def slack_configured(self) -> bool:
        return any((self.slack_bot_token, self.slack_signing_secret, self.slack_app_token))

    @field_validator("prune_older_than")
    @classmethod
    def _prune_horizon(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from approvald.runtime.policy import parse_duration
        from approvald.runtime.retention import MIN_HORIZON
        if parse_duration(v) < MIN_HORIZON:
            raise ValueError("must be at least 1d")
        return v

    @field_validator("max_ttl")
    @classmethod
    def _max_ttl(cls, v: str) -> str:
        from approvald.runtime.policy import parse_duration
        parse_duration(v)
        return v

    def max_ttl_value(self) -> timedelta:
        from approvald.runtime.policy import parse_duration
        return parse_duration(self.max_ttl)

    @field_validator("audit_key")
    @classmethod
    def _audit_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value().encode()) < 16:
            raise ValueError("an audit key needs at least 16 bytes")
        return v

    def audit_keys(self) -> list[AuditKey]:
        """The current audit key first, then the retired ones (for ``audit verify``)."""
        keys = [AuditKey(self.audit_key.get_secret_value())] if self.audit_key else []
        if self.audit_old_keys is not None:
            for raw in self.audit_old_keys.get_secret_value().split(","):
                if raw.strip():
                    try:
                        keys.append(AuditKey(raw.strip()))
                    except ConfigError:
                        raise ConfigError("APPROVALD_AUDIT_OLD_KEYS: each key needs at least "
                                          "16 bytes") from None
        return keys

    def token_secret(self) -> str | None:
        """The key approval tokens are derived from (APPROVALD_SECRET, else a Slack secret)."""
        for s in (self.secret, self.slack_signing_secret, self.slack_app_token):
            if s is not None and s.get_secret_value():
                return s.get_secret_value()
        return None


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


def load_settings() -> Settings:
    """Read the environment; raise :class:`ConfigError` naming the first bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = str(err["loc"][0]) if err["loc"] else "environment"
        var = _ALIASES.get(loc, loc)
        got = err.get("input")
        shown = f" (got {got!r})" if isinstance(got, str | int | float) else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{var}: {msg}{shown}") from None
