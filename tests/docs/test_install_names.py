"""The docs name approvald's install as a reader can do it today: from a checkout
(``pip install '.[mcp]'``), since approvald is not published on a package index yet; the
index's name (``'approvald[mcp]'``) only beside the word "published". Every extra they name
exists in pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
             ["optional-dependencies"])
_INDEX_NAME = re.compile(r"approvald\[([\w,-]+)\]")
_CHECKOUT_EXTRA = re.compile(r"(?:'|\s)(?:\.|/path/to/approvald)\[([\w,-]+)\]")


def paragraphs(page: Path) -> list[str]:
    return re.split(r"\n\s*\n", page.read_text(encoding="utf-8"))


def test_the_index_name_is_only_given_for_once_approvald_is_published() -> None:
    wrong = [f"{page.relative_to(ROOT)}: {para.strip()[:200]!r}"
             for page in PAGES for para in paragraphs(page)
             if _INDEX_NAME.search(para) and "published" not in para]
    assert wrong == [], "\n".join(wrong)


def test_every_extra_the_docs_name_exists() -> None:
    named = {(page.relative_to(ROOT), extra)
             for page in PAGES for m in [*_INDEX_NAME.finditer(page.read_text()),
                                         *_CHECKOUT_EXTRA.finditer(page.read_text())]
             for extra in m.group(1).split(",")}
    assert named, "no extra named: the patterns no longer match the docs"
    assert sorted((str(p), e) for p, e in named if e not in EXTRAS) == []
