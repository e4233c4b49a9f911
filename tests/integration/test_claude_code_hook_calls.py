"""Issue 50: the Python the Claude Code hook's own code runs for one auto decision, counted.

What ``bot/claude_code.py`` and ``bot/claude_code_contract.py`` call while an event is
read and decided (an auto ``Read``, allowed at once): each call of a function of theirs,
and each call they make into anything else (the runtime, the standard library, builtins),
counted once, not what those go on to do (that is the runtime's own to count). Cut from
it, with no answer changed: the event's text encoded again after its bytes were measured
(``HookEvent.read``), the hook's form worked out on each use, the hook's credential name
built again for each event. Each of those put back raises the count past the bound.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from approvald.bot import claude_code, claude_code_contract
from approvald.bot.claude_code import ClaudeCodeHook, HookEvent
from approvald.runtime.engine import Engine
from approvald.runtime.policies.policy import PolicyFile

POLICY = PolicyFile.model_validate({"tools": {"hook:claude-code/Read": {"policy": "auto"}}})
HOOK_FILES = {claude_code.__file__, claude_code_contract.__file__}
# calls of (and from) the hook's own code per auto decision, the event read included:
# 69 before the cuts
BOUND = 62


def _mine(frame: FrameType | None) -> bool:
    return frame is not None and frame.f_code.co_filename in HOOK_FILES


async def hook_calls(work: Callable[[], Awaitable[Any]]) -> tuple[Any, Counter[str]]:
    """``work``'s result, and the calls of or from the hook's own code it made (by name)."""
    seen: Counter[str] = Counter()

    def profile(frame: FrameType, what: str, arg: Any) -> None:
        if what == "call" and (_mine(frame) or _mine(frame.f_back)):
            seen[frame.f_code.co_qualname] += 1
        elif what == "c_call" and _mine(frame):
            seen[getattr(arg, "__qualname__", repr(arg))] += 1

    sys.setprofile(profile)
    try:
        out = await work()
    finally:
        sys.setprofile(None)
    return out, seen


def raw(use: str) -> bytes:
    return json.dumps({
        "hook_event_name": "PreToolUse", "session_id": "s-50", "cwd": "/home/dana/shop",
        "tool_name": "Read", "tool_input": {"file_path": f"/home/dana/shop/{use}.md"},
        "tool_use_id": use}).encode()


async def test_an_auto_decision_runs_few_calls_of_the_hooks_own(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(policy=POLICY)

    async def decide(use: str) -> dict[str, Any]:
        ev = HookEvent.read(raw(use))
        return await ClaudeCodeHook(engine, ev, requested_by="U_DANA",
                                    bearer="dana-laptop").pre_tool_use(wait=0)

    await decide("warm")  # the hook's credential and switch read once, then kept
    out, seen = await hook_calls(lambda: decide("toolu_1"))
    said = out["hookSpecificOutput"]
    assert said["permissionDecision"] == "allow", out
    assert "allowed by the operator's policy" in said["permissionDecisionReason"], out
    total = sum(seen.values())
    assert total <= BOUND, f"{total} calls of or from the hook's code: {sorted(seen.items())}"
    # the event's bytes are measured once (read), its text not encoded again to measure it
    assert seen["str.encode"] == 0, seen
