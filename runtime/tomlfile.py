"""Reading a TOML file whose every problem is one error line naming the file (the policy
file, an eval dataset): the caller words each case, the cause is not chained."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from approvald.runtime.errors import ConfigError


def read_toml(path: Path, *, error: type[ConfigError], missing: str, unreadable: str,
              invalid: str) -> dict[str, Any]:
    """The table in ``path`` (UTF-8). A file that does not exist is ``error(missing)``; one
    that cannot be read or decoded, ``error("<unreadable>: <cause>")``; one that is not
    TOML, ``error("<invalid>: <cause>")``."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(missing) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{unreadable}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{invalid}: {exc}") from None
