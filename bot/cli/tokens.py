"""``approvald tokens create|list|revoke``: the HTTP API's bearer tokens."""

from __future__ import annotations

import argparse
import json
from typing import Any

from approvald.bot.cli.common import JSON, Subparsers, operator
from approvald.bot.config import Settings
from approvald.bot.wiring import open_database
from approvald.runtime import (
    AuditKey,
    AuditTrail,
    Clock,
    ConfigError,
    FileClock,
    SystemClock,
    api_tokens,
    webhook_keys,
)
from approvald.store.repos.external import TokenRecord


def register(sub: Subparsers) -> None:
    """Add ``tokens create|list|revoke``."""
    tk = sub.add_parser("tokens", help="bearer tokens of the HTTP API (/v1)").add_subparsers(
        dest="sub", required=True, metavar="COMMAND")
    c = tk.add_parser("create", help="make a token and its webhook secret; both are printed "
                      "once (only the token's SHA-256 is kept)")
    c.add_argument("name", help="what the token is for (a-z, 0-9, '.', '_', '-'); requests "
                   "it makes run as agent external:NAME, and its tools are named "
                   "api:NAME/TOOL in the policy file")
    c.add_argument("--tools", metavar="TOOLS",
                   help="the tools an API token may ask about, comma-separated names or "
                        "globs ('deploy,db_*'; '*': any); a request for another tool is "
                        "refused (403)")
    c.add_argument("--face", metavar="FACE",
                   help="instead of the /v1 API, the one face the token calls: "
                        + "; ".join(f"{k}: {v}" for k, v in sorted(api_tokens.FACES.items()))
                        + "; mcp:NAME: the MCP gateway NAME (/mcp/NAME)")
    c.add_argument("--requested-by", metavar="USER",
                   help="with --face: the Slack user (U…) every call made with the token is "
                        "made for (they may not approve their own calls)")
    c.add_argument("--webhook-url", metavar="URL",
                   help="POST each decision on its requests here, signed with the webhook "
                        "secret (a request may name its own); its host must be in "
                        "APPROVALD_WEBHOOK_HOSTS")
    c.add_argument("--json", action="store_true", help=JSON)
    c.set_defaults(fn=cmd_create)

    ls = tk.add_parser("list", help="every token (never the token itself), oldest first")
    ls.add_argument("--json", action="store_true", help=JSON)
    ls.set_defaults(fn=cmd_list)

    rv = tk.add_parser("revoke", help="stop a token working, at once")
    rv.add_argument("name", help="the token's name")
    rv.set_defaults(fn=cmd_revoke)


def _clock(s: Settings) -> Clock:
    return FileClock(s.clock_file) if s.clock_file else SystemClock()


def _audit(s: Settings) -> AuditTrail:
    return AuditTrail(AuditKey(s.audit_key.get_secret_value()) if s.audit_key else None)


def _row(t: TokenRecord) -> dict[str, Any]:
    return {"name": t.name, "created_at": t.created_at.isoformat(), "created_by": t.created_by,
            "tools": api_tokens.token_tools(t), "webhook_url": t.webhook_url,
            "face": t.face, "requested_by": t.requested_by,
            "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
            "revoked_by": t.revoked_by}


async def cmd_create(s: Settings, a: argparse.Namespace) -> int:
    keys = webhook_keys(s.token_secret())
    if keys is None:
        raise ConfigError("APPROVALD_SECRET is not set or shorter than 16 characters "
                          "(the key webhook secrets are derived from)")
    db = await open_database(s)
    try:
        made = await api_tokens.create(db, _clock(s), keys, _audit(s), a.name,
                                       created_by=operator(), via="cli", tools=a.tools,
                                       face=a.face, requested_by=a.requested_by,
                                       webhook_url=a.webhook_url,
                                       webhook_hosts=s.webhook_allowlist())
    finally:
        await db.close()
    if a.json:
        print(json.dumps({**_row(made.record), "token": made.token,
                          "webhook_secret": made.webhook_secret if a.face is None else None},
                         indent=2))
        return 0
    if made.record.face is not None:
        print(f"token {a.name} created for {api_tokens.face_name(made.record.face)}, its calls "
              f"made for {made.record.requested_by}; it is shown this once (approvald keeps "
              f"only its SHA-256):\n  token           {made.token}\n"
              f"Send it as: Authorization: Bearer {made.token}")
        return 0
    print(f"token {a.name} created for tools {', '.join(api_tokens.parse_tools(a.tools))}; "
          f"it is shown this once (approvald keeps only its SHA-256):\n"
          f"  token           {made.token}\n"
          f"  webhook secret  {made.webhook_secret}\n"
          f"Call the API with: Authorization: Bearer {made.token}")
    return 0


async def cmd_list(s: Settings, a: argparse.Namespace) -> int:
    db = await open_database(s)
    try:
        rows = await api_tokens.tokens(db)
    finally:
        await db.close()
    if a.json:
        print(json.dumps([_row(t) for t in rows], indent=2))
        return 0
    for t in rows:
        state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M} by {t.revoked_by}" \
            if t.revoked_at else "live"
        tools = api_tokens.token_tools(t)
        scope = (f"{t.face} for {t.requested_by}" if t.face
                 else "tools " + ",".join(tools)) if tools is not None else (
            "its own tools" if t.created_by.startswith(api_tokens.OWN)
            else "any tool (made before token scopes)")
        print(f"{t.name:<24} created {t.created_at:%Y-%m-%d %H:%M} by {t.created_by}  "
              f"{state}  {scope}"
              + (f"  webhook {t.webhook_url}" if t.webhook_url else ""))
    if not rows:
        print("no tokens (make one with `approvald tokens create NAME`)")
    return 0


async def cmd_revoke(s: Settings, a: argparse.Namespace) -> int:
    db = await open_database(s)
    try:
        t = await api_tokens.revoke(db, _clock(s), _audit(s), a.name, by=operator(),
                                    via="cli")
    finally:
        await db.close()
    print(f"token {t.name} revoked")
    return 0
