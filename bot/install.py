"""How to install one of approvald's extras, said as this installation was made.

approvald is installed from a checkout until it is published, so "pip install
'approvald[mcp]'" would send a user to a package index that does not have it. The command
is read from the installer's record of where the package came from (PEP 610's
``direct_url.json``): a directory (``pip install '/path/to/checkout[mcp]'``, with ``-e``
for an editable install), a VCS or archive URL (``'approvald[mcp] @ URL'``), or, with no
such record, an index (``'approvald[mcp]'``, right once it is published).
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

DIST = "approvald"


class _Metadata(Protocol):
    def read_text(self, filename: str) -> str | None: ...


def _installed() -> _Metadata | None:
    """approvald's metadata as pip installed it: one with a ``direct_url.json`` if any
    (a build's ``approvald.egg-info`` in the working directory has none), else the first."""
    found = list(metadata.distributions(name=DIST))
    return next((d for d in found if d.read_text("direct_url.json")), found[0] if found else None)


_UNSET: Any = object()


def install_command(extra: str, dist: _Metadata | None = _UNSET) -> str:
    """The pip command that adds ``extra`` to approvald as it was installed (``dist``: its
    metadata; by default, the installed distribution's)."""
    if dist is _UNSET:
        dist = _installed()
    if dist is None:  # run from a checkout without installing it
        return f"pip install '.[{extra}]' (at the top of approvald's checkout)"
    try:
        origin = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        origin = None
    if not isinstance(origin, dict) or not isinstance(origin.get("url"), str):
        return f"pip install '{DIST}[{extra}]'"  # from an index
    url: str = origin["url"]
    if "dir_info" in origin and url.startswith("file:"):
        path = unquote(urlparse(url).path)
        editable = isinstance(origin["dir_info"], dict) and origin["dir_info"].get("editable")
        return f"pip install {'-e ' if editable else ''}'{path}[{extra}]'"
    vcs = origin.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        at = f"@{vcs['commit_id']}" if vcs.get("commit_id") else ""
        url = f"{vcs['vcs']}+{url}{at}"
    return f"pip install '{DIST}[{extra}] @ {url}'"
