"""Claude Code's settings file, as far as approvald's hooks go: what ``approvald hook
install claude-code`` merges into it, and what ``approvald hook check claude-code`` finds
wrong in it.

Claude Code reads its hooks from ``~/.claude/settings.json`` (the user's),
``.claude/settings.json`` (the project's, shared) and ``.claude/settings.local.json`` (the
project's, not committed), and runs every hook that matches. Under ``"hooks"``, each event
(``PreToolUse``, ``PostToolUse``, ``PostToolUseFailure``) has a list of matcher groups
(``{"matcher": "*", "hooks": [...]}``), and each hook is either a command (``"type":
"command"``, ``"command"``: a shell command line) or an HTTP endpoint (``"type": "http"``,
``"url"``, ``"headers"`` whose ``$VARIABLES`` are filled only from the names in
``"allowedEnvVars"``), with a ``"timeout"`` in seconds and ``"onFailure"``: ``"block"``
makes a hook that cannot start, times out or exits with a status other than 0 or 2 (or
answers non-2xx) block the call; otherwise Claude Code runs it, under its own permission
rules.

Claude Code runs a command hook with its own environment, whose ``PATH`` need not hold a
virtualenv's ``bin``: the hooks written here name this installation's ``approvald`` by its
absolute path.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from approvald.bot.claude_code_contract import (
    DEFAULT_WAIT,
    EVENTS,
    MARGIN,
    POST,
    POST_FAILED,
    PRE,
    START,
    settings_timeout,
)
from approvald.bot.hooks.handoff import PATH as HOOK_PATH
from approvald.bot.hooks.handoff import TOKEN_VARIABLE as TOKEN_VARIABLE

# the default timeout of a command or HTTP hook in the oldest Claude Code releases that
# have hooks (60 s) and in current ones (600 s): a hook without a timeout gets one of them
OLDEST_DEFAULT_TIMEOUT = 60
WHY = {PRE: "no call is put to approvald's policy",
       POST: "what ran is not recorded in the audit log",
       POST_FAILED: "calls that failed are not recorded in the audit log"}


class SettingsError(Exception):
    """A settings file approvald cannot read or merge into (nothing was changed)."""


def user_file() -> Path:
    return Path.home() / ".claude" / "settings.json"


def project_files(root: Path | None = None) -> tuple[Path, Path]:
    """The project's shared and local settings files (under ``root``, default: here)."""
    base = (root or Path.cwd()) / ".claude"
    return base / "settings.json", base / "settings.local.json"


def executable() -> str:
    """The shell words that run this installation's ``approvald``, by absolute path: the
    console script this process was started as, else this interpreter with ``-m``."""
    started_as = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if started_as is not None and started_as.name == "approvald" and started_as.is_file():
        return shlex.quote(str(started_as.absolute()))
    return f"{shlex.quote(str(Path(sys.executable).absolute()))} -m approvald.bot.cli"


@dataclass(frozen=True)
class Hooks:
    """approvald's hooks for Claude Code: the command hook (deciding here, or handing the
    event to ``serve``), or the HTTP hook of a ``serve`` at ``http``."""

    wait: float = DEFAULT_WAIT
    requested_by: str | None = None
    serve: str | None = None  # the command hook hands the event to this serve
    http: str | None = None  # serve's URL: HTTP hooks instead of the command
    command: str = ""  # what runs approvald (default: :func:`executable`)

    def for_event(self, event: str) -> dict[str, Any]:
        """The hook (one entry of a matcher group's ``hooks``) for ``event``."""
        wait = self.wait if event == PRE else 0.0
        if self.http is not None:
            url = self.http.rstrip("/")
            url = url if url.endswith(HOOK_PATH) else url + HOOK_PATH
            if event == PRE:
                url += f"?wait={wait:g}"
            return {"type": "http", "url": url,
                    "headers": {"Authorization": f"Bearer ${TOKEN_VARIABLE}"},
                    "allowedEnvVars": [TOKEN_VARIABLE], "timeout": settings_timeout(wait),
                    "onFailure": "block"}
        words = [self.command or executable(), "hook", "claude-code"]
        if self.requested_by:
            words += ["--requested-by", shlex.quote(self.requested_by)]
        if self.serve:
            words += ["--serve", shlex.quote(self.serve)]
        if event == PRE:
            words += ["--wait", f"{wait:g}"]
        return {"type": "command", "command": " ".join(words),
                "timeout": settings_timeout(wait), "onFailure": "block"}

    def all(self) -> dict[str, list[dict[str, Any]]]:
        """Every event's matcher group, as :func:`merge` writes them."""
        return {event: [{"matcher": "*", "hooks": [self.for_event(event)]}] for event in EVENTS}


def is_ours(hook: Any) -> bool:
    """Whether a settings file's hook entry is one of approvald's Claude Code hooks."""
    if not isinstance(hook, dict):
        return False
    if hook.get("type") == "http":
        return urlsplit(str(hook.get("url", ""))).path.rstrip("/").endswith(HOOK_PATH)
    try:
        words = shlex.split(str(hook.get("command", "")))
    except ValueError:
        return False
    return any(words[i:i + 2] == ["hook", "claude-code"] for i in range(len(words)))


def load(path: Path) -> dict[str, Any]:
    """The settings in ``path`` ({} when there is no such file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SettingsError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise SettingsError(f"{path} is not JSON ({exc}); fix it first") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("hooks", {}), dict):
        raise SettingsError(f"{path}: expected a JSON object whose \"hooks\" is an object")
    return doc


def merge(doc: dict[str, Any], hooks: Hooks) -> dict[str, Any]:
    """``doc`` with approvald's hooks for every event: one that is alone in its matcher
    group is replaced where it stands (the group then matches every tool), other copies
    are taken out, and a new group is added at the end where there was none. Everything
    else in ``doc`` is kept as it was."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    all_hooks = out.setdefault("hooks", {})
    for event in EVENTS:
        ours, placed = hooks.for_event(event), False
        groups = all_hooks.get(event)
        groups = groups if isinstance(groups, list) else []
        kept = []
        for group in groups:
            entries = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(entries, list) or not any(is_ours(h) for h in entries):
                kept.append(group)
                continue
            if not placed and len(entries) == 1:
                kept.append({**group, "matcher": "*", "hooks": [ours]})
                placed = True
                continue
            rest = [h for h in entries if not is_ours(h)]
            if rest:
                kept.append({**group, "hooks": rest})
        if not placed:
            kept.append({"matcher": "*", "hooks": [ours]})
        all_hooks[event] = kept
    return out


def write(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a new file beside it, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(path.name + ".approvald-new")
    new.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(new, path)


@dataclass(frozen=True)
class Finding:
    """One thing ``check`` says: a problem (the hook may let a call through, or deny them
    all) or a note."""

    problem: bool
    text: str


def check(files: list[tuple[Path, dict[str, Any]]], environ: dict[str, str] | None = None
          ) -> list[Finding]:
    """What is wrong with approvald's hooks in Claude Code's settings ``files`` (each a
    path and its settings), taken together as Claude Code takes them."""
    env = dict(os.environ if environ is None else environ)
    found: list[Finding] = []
    covered: set[str] = set()
    for path, doc in files:
        for event, groups in (doc.get("hooks") or {}).items():
            for group in groups if isinstance(groups, list) else []:
                for hook in (group.get("hooks") or []) if isinstance(group, dict) else []:
                    if is_ours(hook) and event in EVENTS:
                        covered.add(event)
                        found += _check_hook(path, event, hook, env)
    for event in EVENTS:
        if event not in covered:
            found.append(Finding(True, f"{event}: no approvald hook: {WHY[event]}"))
    return found


def _check_hook(path: Path, event: str, hook: dict[str, Any], env: dict[str, str]
                ) -> list[Finding]:
    where = f"{event} in {path}"
    out: list[Finding] = []
    if hook.get("onFailure") != "block":
        out.append(Finding(True, f"{where}: no \"onFailure\": \"block\": if the hook cannot "
                                 "start, times out or fails, Claude Code runs the call "
                                 "under its own permission rules"))
    if hook.get("type") == "http":
        url = urlsplit(str(hook.get("url", "")))
        wait = _number(parse_qs(url.query).get("wait", [None])[0], DEFAULT_WAIT)
        out += _check_token(where, hook, env)
    else:
        try:
            words = shlex.split(str(hook.get("command", "")))
        except ValueError as exc:
            return [*out, Finding(True, f"{where}: the command is not a shell line ({exc})")]
        out += _check_command(where, words, env)
        wait = _number(_flag(words, "--wait"), DEFAULT_WAIT)
    wait = wait if event == PRE else 0.0
    need = wait + MARGIN
    timeout = hook.get("timeout")
    if timeout is None:
        if need + START > OLDEST_DEFAULT_TIMEOUT:
            out.append(Finding(True, f"{where}: no timeout, and the hook may take {need:g} s "
                                     f"(wait {wait:g} + {MARGIN:g}): older Claude Code "
                                     f"releases give up after {OLDEST_DEFAULT_TIMEOUT} s; give "
                                     f"\"timeout\": {settings_timeout(wait)}"))
    elif not isinstance(timeout, int | float) or timeout < need + START:
        out.append(Finding(True, f"{where}: \"timeout\": {timeout!r} leaves no room: the hook "
                                 f"answers within {need:g} s (wait {wait:g} + {MARGIN:g}) of "
                                 f"starting; give {settings_timeout(wait)} or more, or a "
                                 "shorter --wait"))
    if not out:
        out.append(Finding(False, f"{where}: {_shown(hook)}"))
    return out


def _check_command(where: str, words: list[str], env: dict[str, str]) -> list[Finding]:
    if not words:
        return [Finding(True, f"{where}: the command is empty")]
    exe = words[0]
    if not os.path.isabs(exe):
        return [Finding(True, f"{where}: {exe!r} is not an absolute path: Claude Code finds it "
                              "only if it is on Claude Code's own PATH (a virtualenv's bin "
                              "usually is not), and a hook that is not found lets the call "
                              "run; `approvald hook install claude-code` writes the absolute "
                              "path")]
    if not os.path.isfile(exe):
        return [Finding(True, f"{where}: {exe} is not found")]
    if not os.access(exe, os.X_OK):
        return [Finding(True, f"{where}: {exe} is not executable")]
    if _flag(words, "--serve") is not None and not env.get(TOKEN_VARIABLE, "").strip():
        return [Finding(True, f"{where}: the hook hands calls to serve, but {TOKEN_VARIABLE} "
                              "is not set here: every call would be denied")]
    return []


def _check_token(where: str, hook: dict[str, Any], env: dict[str, str]) -> list[Finding]:
    headers = hook.get("headers") if isinstance(hook.get("headers"), dict) else {}
    auth = next((str(v) for k, v in (headers or {}).items()
                 if str(k).lower() == "authorization"), "")
    if not auth.lower().startswith("bearer "):
        return [Finding(True, f"{where}: no \"Authorization: Bearer ...\" header: serve "
                              "answers 401, and without onFailure block the call runs")]
    allowed = hook.get("allowedEnvVars") if isinstance(hook.get("allowedEnvVars"), list) \
        else []
    out = []
    for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", auth):
        if name not in (allowed or []):
            out.append(Finding(True, f"{where}: the header uses ${name}, which "
                                     "\"allowedEnvVars\" does not list: Claude Code sends an "
                                     "empty token"))
        elif not env.get(name, "").strip():
            out.append(Finding(True, f"{where}: ${name} is not set here: Claude Code would "
                                     "send an empty token"))
    return out


def _flag(words: list[str], flag: str) -> str | None:
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def _number(text: str | None, default: float) -> float:
    try:
        return default if text is None else float(text)
    except ValueError:
        return default


def _shown(hook: dict[str, Any]) -> str:
    what = hook.get("url") if hook.get("type") == "http" else hook.get("command")
    return f"{what}, timeout {hook.get('timeout')}, onFailure {hook.get('onFailure')}"
