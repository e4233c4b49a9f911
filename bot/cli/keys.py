"""``approvald keys reseal``: sensitive values sealed again under the current data key."""

from __future__ import annotations

import argparse

from approvald.bot.cli.common import Subparsers, UsageError, operator, with_engine
from approvald.bot.config import Settings
from approvald.runtime import Engine
from approvald.store.sealed import BATCH


def register(sub: Subparsers) -> None:
    """Add ``keys reseal``."""
    ks = sub.add_parser("keys", help="the data key sensitive values are sealed under"
                        ).add_subparsers(dest="sub", required=True, metavar="COMMAND")
    rs = ks.add_parser("reseal", help="seal every sensitive value again under "
                       "APPROVALD_DATA_KEY (opening what a retired key sealed with "
                       "APPROVALD_DATA_OLD_KEYS, and sealing what was stored in clear), "
                       "in batches, beside a running serve if need be; audited")
    rs.add_argument("--batch", type=int, default=BATCH, metavar="ROWS",
                    help="rows rewritten per transaction")
    rs.set_defaults(fn=cmd_reseal)


async def cmd_reseal(s: Settings, a: argparse.Namespace) -> int:
    sealer = s.sealer()
    if a.batch < 1:
        raise UsageError("--batch: at least 1 row")

    async def run(engine: Engine) -> int:
        counts = await engine.reseal(sealer, actor=operator(), via="cli", batch=a.batch)
        current = sealer.current
        assert current is not None  # reseal refuses without one
        n = sum(counts.values())
        print(f"resealed {n} value{'s' if n != 1 else ''} under data key {current.id}")
        return 0

    return await with_engine(s, run)
