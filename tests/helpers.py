"""Running the real ``approvald`` command in subprocesses, as users and crash tests do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

APPROVALD = str(Path(sys.executable).parent / "approvald")


@dataclass
class Cli:
    """An ``approvald`` bound to one database, demo ledger and clock file."""

    db_url: str
    workdir: Path
    env_extra: dict[str, str] = field(default_factory=dict)

    @property
    def ledger(self) -> Path:
        return self.workdir / "ledger.jsonl"

    @property
    def clock_file(self) -> Path:
        return self.workdir / "clock"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("APPROVALD_", "SLACK_"))}
        env.update(APPROVALD_DATABASE_URL=self.db_url, APPROVALD_DEMO_LEDGER=str(self.ledger),
                   APPROVALD_CLOCK_FILE=str(self.clock_file), APPROVALD_LOG_LEVEL="WARNING",
                   APPROVALD_METRICS_ADDR="127.0.0.1:0")
        env.update(self.env_extra)
        env.update(extra)
        return env

    def __call__(self, *args: str, failpoints: str | None = None, timeout: float = 60,
                 **extra: str) -> subprocess.CompletedProcess[str]:
        env = self.env(**extra)
        if failpoints:
            env["APPROVALD_FAILPOINTS"] = failpoints
        return subprocess.run([APPROVALD, *args], env=env, cwd=self.workdir, text=True,
                              capture_output=True, timeout=timeout, check=False)

    def spawn(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([APPROVALD, *args], env=self.env(**extra), cwd=self.workdir,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def json(self, *args: str) -> Any:
        done = self(*args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def ok(self, *args: str, code: int = 0) -> str:
        done = self(*args)
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return done.stdout

    def ledger_lines(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(x) for x in self.ledger.read_text().splitlines() if x.strip()]

    def set_time(self, when: datetime) -> None:
        self.clock_file.write_text(when.isoformat())

    def advance_time(self, delta: timedelta) -> datetime:
        now = datetime.fromisoformat(self.clock_file.read_text().strip())
        self.set_time(now + delta)
        return now + delta


START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def make_cli(db_url: str, tmp_path: Path) -> Cli:
    cli = Cli(db_url=db_url, workdir=tmp_path)
    cli.set_time(START)
    return cli


class Crash(BaseException):
    """The process dies at a failpoint (in-process tests cannot SIGKILL themselves); a
    BaseException, so nothing on the way swallows it."""


def crash(name: str) -> None:
    """A failpoint action: die here (``failpoints.arm(name, crash)``)."""
    raise Crash(name)
