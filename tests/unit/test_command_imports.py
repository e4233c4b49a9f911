"""What a command that opens the database imports, in a process of its own: what it uses,
not the packages of work it never does. The Claude Code hook deciding a call itself runs
such a process for every tool call, and every other command pays the same start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# a policy file with a rule: its condition is compiled as the command loads the policy
POLICY = """
[tools."hook:claude-code/Bash"]
approvers = ["U_ALICE"]

[[tools."hook:claude-code/Bash".rules]]
when = 'args.command.startsWith("ls")'
policy = "auto"
"""

# (package, what it is for, which no command that only reads needs): the CEL package's
# REPL (its __init__ imports it: typer, rich, prompt_toolkit), the expiry scheduler's
# APScheduler (serve's), the cipher of sealed values (a deployment with a data key's), and
# the faces' HTTP and Slack packages
UNUSED = ("typer", "rich", "prompt_toolkit", "pygments", "apscheduler", "cryptography",
          "aiohttp", "slack_bolt", "slack_sdk")

SCRIPT = """
import json, sys
from approvald.bot.cli import main
code = main(["approvals", "list"])
print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules}), "cel.cel" in sys.modules]))
"""


@pytest.mark.slow  # a fresh process: what it imports is the point
def test_a_command_imports_none_of_the_packages_it_does_not_use(tmp_path: Path,
                                                                 sqlite_url: str) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPROVALD_", "SLACK_"))}
    env.update(HOME=str(tmp_path), APPROVALD_DATABASE_URL=sqlite_url,
               APPROVALD_POLICY_FILE=str(tmp_path / "policy.toml"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    code, packages, compiled = json.loads(done.stdout.splitlines()[-1])
    assert code == 0, done.stderr
    # it did the work: the database read (SQLAlchemy), the rule compiled (CEL's engine)
    assert {"sqlalchemy", "aiosqlite", "cel"} <= set(packages) and compiled, packages
    assert sorted(set(UNUSED) & set(packages)) == []
