"""Reading a TOML file whose every problem is one error line naming the file (the policy
file, an eval dataset): the caller words each case, the cause is not chained."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from approvald.runtime.kernel.errors import ConfigError


def read_toml(path: Path, *, error: type[ConfigError], missing: str, unreadable: str,
              invalid: str) -> dict[str, Any]:
    """The table in ``path`` (UTF-8). A file that does not exist is ``error(missing)``; one
    that cannot be read or decoded, ``error("<unreadable>: <cause>")``; one that is not
    TOML, ``error("<invalid>: <cause>")``."""
    return read_toml_text(path, error=error, missing=missing, unreadable=unreadable,
                          invalid=invalid)[0]


def read_toml_text(path: Path, *, error: type[ConfigError], missing: str, unreadable: str,
                   invalid: str) -> tuple[dict[str, Any], str]:
    """The table in ``path`` and the file's text exactly as its bytes say (UTF-8, no
    newline translation: the SHA-256 of the text is that of the file)."""
    try:
        text = path.read_bytes().decode("utf-8")
        return tomllib.loads(text), text
    except FileNotFoundError:
        raise error(missing) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{unreadable}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{invalid}: {exc}") from None
