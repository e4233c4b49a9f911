"""``approvald keys reseal``: sensitive values sealed again under the current data key."""

from __future__ import annotations

import argparse

from approvald.bot.cli.common import Subparsers
from approvald.bot.config import Settings
from approvald.bot.wiring import open_database
from approvald.runtime import sealing


def register(sub: Subparsers) -> None:
    """Add ``keys reseal``."""
    ks = sub.add_parser("keys", help="the data key sensitive values are sealed under"
                        ).add_subparsers(dest="sub", required=True, metavar="COMMAND")
    rs = ks.add_parser("reseal", help="seal every sensitive value again under "
                       "APPROVALD_DATA_KEY (opening what a retired key sealed with "
                       "APPROVALD_DATA_OLD_KEYS, and sealing what was stored in clear)")
    rs.set_defaults(fn=cmd_reseal)


async def cmd_reseal(s: Settings, a: argparse.Namespace) -> int:
    sealer = s.sealer()
    db = await open_database(s)
    try:
        n = await sealing.reseal(db, sealer)
    finally:
        await db.close()
    current = sealer.current
    assert current is not None  # reseal refuses without one
    print(f"resealed {n} value{'s' if n != 1 else ''} under data key {current.id}")
    return 0
