"""How many of approvald's modules one Approve click crosses, from the signed HTTP request
reaching ``serve`` to the approved tool starting (issue 47): run it from the top of a
checkout, ``python .ci/click_path.py`` (``--list`` names them, in the order first entered).

An in-process ``serve`` (the test harness: Slack emulator over real HTTP, worker and outbox
drain running) pauses a refund; the profiler then records every call into an
``approvald.*`` module (but the emulator's and its client's: Slack's side) made by the
tasks that carry the click (the HTTP request's, bolt's
listener's, the worker's), leaving out the tasks that only happen to run meanwhile (the
outbox drain, the run-thread follower, the scheduler's jobs), until the refund tool is
entered.

Besides the count, it tells the modules apart by what the click does in them, from the
calls it sees (a call from a frame of one ``approvald`` module into another):

* **the chain**: the modules the click passes through, each calling on into another;
* **helpers**: modules it only calls and returns from (the clock, ids, metrics, a row's
  type), calling no other ``approvald`` module on the way;
* **layers crossed**: the layers those modules sit in (``store``, ``runtime``'s layers as
  ``.ci/architecture.py`` names them, a ``bot`` face's package), in the order entered;
* **calls up a layer** at run time: a call from a module into one of a higher layer (bottom
  to top: ``store``, ``runtime``'s layers as ``.ci/architecture.py`` orders them, then the
  faces of ``bot``): a callback, or the worker calling back up into the engine. The import
  check in ``.ci/architecture.py`` cannot see these; this one names each.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from approvald.bot.slack import cards  # noqa: E402

sys.path.insert(0, str(ROOT / ".ci"))
from architecture import LAYERS, layer_of  # noqa: E402

from tests.integration.slack_harness import CHANNEL, harness, wait_for  # noqa: E402

# tasks that run beside a click without being part of it
BYSTANDERS = ("outbox", "threads", "slack-connect", "wakeups")
# Slack's side of the click, played in this process: the emulator and its signed client
SLACK_SIDE = "approvald.bot.sandbox"
TOOL = "issue_refund"


class Path_:
    """The modules entered, in order, until the tool starts."""

    def __init__(self) -> None:
        self.modules: list[str] = []
        self.calls: set[tuple[str, str]] = set()  # (caller's module, callee's module)
        self.started = asyncio.Event()

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or self.started.is_set():
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("approvald.") or name.startswith(SLACK_SIDE):
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is not None and task.get_name().startswith(BYSTANDERS):
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if caller != name and caller.startswith("approvald.") and not caller.startswith(SLACK_SIDE):
            self.calls.add((caller, name))
        if frame.f_code.co_name == TOOL and name.endswith(".demo"):
            self.modules.append(name)
            self.started.set()
            return
        if name not in self.modules:
            self.modules.append(name)


def rank(module: str) -> int:
    """How high ``module`` sits: the store lowest, then runtime's layers, the faces top."""
    parts = module.split(".")[1:]
    if parts[0] == "store":
        return 0
    if parts[0] == "runtime":
        layer = layer_of(parts[1:])
        return 1 + LAYERS.index(layer) if layer is not None else 1 + LAYERS.index("top")
    return 2 + len(LAYERS)


def layer(module: str) -> str:
    """The layer ``module`` belongs to: ``store``, ``runtime/<layer>``, or its face in ``bot``."""
    parts = module.split(".")[1:]
    if parts[0] == "runtime":
        return f"runtime/{layer_of(parts[1:]) or 'top'}"
    if parts[0] == "bot" and len(parts) > 2:
        return f"bot/{parts[1]}"
    return parts[0]


def up_a_layer(calls: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in calls if rank(b) > rank(a))


async def measure() -> Path_:
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite+aiosqlite:///{tmp}/click.db"
        async with harness(db_url, Path(tmp), APPROVALD_METRICS_ADDR="off") as h:
            paused = await h.pause_refund()
            [aid] = paused.approval_ids
            await h.card(aid)
            a = await h.approval(aid)
            await asyncio.sleep(0.5)  # the card's own deliveries settle
            value = h.value(a)
            path = Path_()
            sys.setprofile(path.profile)
            try:
                response = await h.slack.click(
                    cards.APPROVE, value, user_id="U_ALICE", channel_id=CHANNEL,
                    message_ts=a.message_ts)
                assert response.status == 200, response.status
                await asyncio.wait_for(path.started.wait(), 30)
            finally:
                sys.setprofile(None)
            await wait_for(lambda: h.refunds(), what="the refund")
            return path


def main(argv: list[str]) -> int:
    path = asyncio.run(measure())
    modules = path.modules
    chain = [m for m in modules if any(a == m for a, _ in path.calls)]
    helpers = [m for m in modules if m not in chain]
    upward = up_a_layer(path.calls)
    by_part = {part: sum(1 for m in modules if m.startswith(f"approvald.{part}."))
               for part in ("bot", "runtime", "store")}
    print(f"modules crossed by one Approve click, HTTP request to tool start: {len(modules)} "
          f"(bot {by_part['bot']}, runtime {by_part['runtime']}, store {by_part['store']})")
    print(f"  the chain, each calling on into another: {len(chain)}; helpers only called: "
          f"{len(helpers)}")
    layers = list(dict.fromkeys(layer(m) for m in modules))
    print(f"  layers crossed: {len(layers)} ({', '.join(layers)})")
    print(f"  calls up a layer at run time: {len(upward)}")
    for a, b in upward:
        print(f"    {a} -> {b}")
    if "--list" in argv:
        print("  the chain:")
        for name in chain:
            print(f"    {name}")
        print("  helpers:")
        for name in helpers:
            print(f"    {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
