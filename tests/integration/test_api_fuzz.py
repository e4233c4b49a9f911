"""The OpenAPI document is the contract, checked by a tool nobody here wrote: schemathesis
(every check, every phase including the stateful one) against a real serve on real HTTP
finds no 500, no undocumented status, no schema-violating request accepted and no
schema-valid request refused.

A short run (its seed fixed, so CI asks the same questions each time); ``APPROVALD_FUZZ_SECONDS``
runs it longer. Long polls are capped at two seconds here (``runtime.runs.external.MAX_WAIT``,
which the served document states), so a generated ``wait`` never outlasts the run.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from approvald.bot.config import Settings
from approvald.bot.serve import Service
from approvald.bot.wiring import open_database
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs import external

from tests.helpers import create_token

ST = Path(sys.executable).parent / "st"
SECRET = "approvald-fuzz-secret-0123456789"
POLICY = """
[tools."api:*/deploy"]
approvers = ["U_ALICE"]

[[tools."api:*/deploy".rules]]
when = "has(args.version) && args.version == 'auto'"
policy = "auto"

[[tools."api:*/deploy".rules]]
when = "has(args.version) && args.version == 'never'"
policy = "forbidden"
reason = "never"
"""


@pytest.mark.slow
async def test_schemathesis_finds_nothing_against_a_real_serve(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(external, "MAX_WAIT", 2.0)
    monkeypatch.setattr(external, "POLL", 0.2)
    (tmp_path / "policy.toml").write_text(POLICY)
    settings = Settings(APPROVALD_DATABASE_URL=sqlite_url, APPROVALD_PORT=0,
                        APPROVALD_HOST="127.0.0.1", APPROVALD_SECRET=SECRET,
                        APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"))
    db = await open_database(settings, quiet=True)
    service = Service(settings, db)
    try:
        await service.start(background=True)
        made = await create_token(service.engine, api_tokens.WebhookKeys(SECRET), "fuzz",
                                  created_by="test", via="test", tools="*")
        url = f"http://127.0.0.1:{service.ops_port}/v1/openapi.json"
        seconds = os.environ.get("APPROVALD_FUZZ_SECONDS", "45")
        proc = await asyncio.create_subprocess_exec(
            str(ST), "run", url, "--checks", "all", "--max-time", seconds, "--workers", "1",
            "--seed", "20261204", "--request-timeout", "15",
            "--header", f"Authorization: Bearer {made.token}",
            "--report", "junit", "--report-dir", str(tmp_path / "report"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path,
            env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": ""})
        out, _ = await asyncio.wait_for(proc.communicate(), float(seconds) * 4 + 60)
        report = out.decode(errors="replace")
        assert proc.returncode == 0, report[-6000:]
        assert "generated" in report, report[-2000:]  # it ran, and said what it tried
    finally:
        await service.stop()
        await db.close()
