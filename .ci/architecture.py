"""The front door's figures (issue 47), counted from the source: run it from the top of a
checkout, ``python .ci/architecture.py`` (``--json`` for one document).

* **reach-throughs**: in ``bot/``, an attribute of the engine that is one of its parts
  (``engine.db``, ``self.engine.decider``, ``self.e.external``…) rather than one of its
  verbs or views, or any private attribute of it (``engine._db``, ``engine._parts``: the
  engine keeps its parts private, and a face reading one past the underscore is counted
  too). What counts as "the engine" is an expression that names it by the
  conventions the code uses: ``engine``, ``self.engine``, ``self.e``, ``e`` (and the same
  after another attribute: ``h.engine``, ``service.engine``).
* **transactions**: in ``bot/``, every ``…db.read(…)``, ``…db.write(…)`` and
  ``…db.transact(…)`` call, and every ``…db.connection()``: a face opening the database
  itself.
* **face-to-face imports**: a module of one face package of ``bot/`` importing another.

The parts are read from ``runtime/engine.py``'s ``Parts`` dataclass, so a part added there is
counted without touching this script.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOT = ROOT / "bot"
FACES = ("api", "cli", "evals", "hooks", "mcp", "sandbox", "slack", "web")
_ENGINE = re.compile(r"(^|\.)(engine|_engine|e)$")
_DB = re.compile(r"(^|\.)(db|_db)$")
TRANSACTIONS = {"read", "write", "transact", "connection"}


def parts() -> set[str]:
    """The names of the engine's parts (``Parts``'s fields, and ``owner``)."""
    tree = ast.parse((ROOT / "runtime" / "engine.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Parts":
            return {n.target.id for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)} \
                | {"owner", "parts"}
    raise SystemExit("runtime/engine.py has no Parts dataclass any more: update this script")


def _modules(where: Path) -> list[Path]:
    return sorted(p for p in where.rglob("*.py") if "__pycache__" not in p.parts)


def _private_or_part(attr: str, names: set[str]) -> bool:
    return attr in names or (attr.startswith("_") and not attr.startswith("__"))


def reach_throughs(names: set[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for path in _modules(BOT):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private_or_part(node.attr, names) \
                    and _ENGINE.search(ast.unparse(node.value)):
                found[str(path.relative_to(ROOT))] += 1
    return found


def transactions() -> Counter[str]:
    found: Counter[str] = Counter()
    for path in _modules(BOT):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in TRANSACTIONS \
                    and _DB.search(ast.unparse(node.func.value)):
                found[str(path.relative_to(ROOT))] += 1
    return found


def face_imports() -> list[str]:
    crossings = []
    for face in FACES:
        others = tuple(f"approvald.bot.{o}" for o in FACES if o != face)
        for path in _modules(BOT / face):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                crossings += [f"{path.relative_to(ROOT)} imports {n}" for n in names
                              if n.startswith(others)]
    return sorted(set(crossings))


def figures() -> dict[str, object]:
    reach = reach_throughs(parts())
    tx = transactions()
    return {"reach_throughs": sum(reach.values()), "reach_through_files": len(reach),
            "reach_throughs_by_file": dict(reach.most_common()),
            "transactions": sum(tx.values()), "transaction_files": len(tx),
            "transactions_by_file": dict(tx.most_common()),
            "face_to_face_imports": face_imports()}


def main(argv: list[str]) -> int:
    found = figures()
    if "--json" in argv:
        print(json.dumps(found, indent=2))
        return 0
    print(f"reach-throughs from bot/ past the front door: {found['reach_throughs']} in "
          f"{found['reach_through_files']} files")
    for path, n in found["reach_throughs_by_file"].items():  # type: ignore[attr-defined]
        print(f"  {n:4d}  {path}")
    print(f"transactions opened in bot/: {found['transactions']} in "
          f"{found['transaction_files']} files")
    for path, n in found["transactions_by_file"].items():  # type: ignore[attr-defined]
        print(f"  {n:4d}  {path}")
    crossings = found["face_to_face_imports"]
    print(f"face-to-face imports: {len(crossings)}")  # type: ignore[arg-type]
    for line in crossings:  # type: ignore[attr-defined]
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
