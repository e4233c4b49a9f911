"""The reference generator (``docs/gen_reference.py``, a script beside the pages, not a
package) loaded for the tests, and readers of what the committed pages document."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "docs" / "gen_reference.py"
REFERENCE = ROOT / "docs" / "reference"
REGENERATE = "run `python docs/gen_reference.py` and commit docs/reference/"


def generator() -> ModuleType:
    module = sys.modules.get("gen_reference")
    if module is None:
        spec = importlib.util.spec_from_file_location("gen_reference", GENERATOR)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["gen_reference"] = module
        spec.loader.exec_module(module)
    return module


def _code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _rows(lines: list[str], start: int) -> list[list[str]]:
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def documented_options(text: str) -> set[tuple[str, ...]]:
    """(command..., option) for each option a CLI page's argument tables list, and
    (command..., <name>) for each positional argument."""
    found: set[tuple[str, ...]] = set()
    lines = text.splitlines()
    command: tuple[str, ...] = ()
    for i, line in enumerate(lines):
        heading = re.match(r"## approvald\b(.*)$", line)
        if heading:
            command = tuple(heading.group(1).split())
        elif line.startswith("| argument |"):
            for row in _rows(lines, i):
                for name in _code_spans(row[0]):
                    found.add((*command, name if name.startswith("-") else f"<{name}>"))
    return found


def documented_settings(text: str) -> set[str]:
    return set(re.findall(r"^## ([A-Z][A-Z0-9_]+)$", text, re.MULTILINE))


def documented_metrics(text: str) -> set[str]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| metric |"):
            return {_code_spans(row[0])[0] for row in _rows(lines, i)}
    return set()


def committed(name: str) -> str:
    path = REFERENCE / name
    return path.read_text(encoding="utf-8") if path.exists() else ""
