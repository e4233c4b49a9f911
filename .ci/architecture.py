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
* **imports past the runtime's facade**: in ``bot/``, an import of a module inside
  ``approvald.runtime`` (``from approvald.runtime.record.outbox import ...``, ``import
  approvald.runtime.engine``, a relative ``from ..runtime.kernel import ...``, or ``from
  approvald.runtime import <a name runtime/__init__.py's table does not export>``): the faces
  import the runtime's names from ``approvald.runtime`` only, whose table says what is public.
* **face-to-face imports**: a module of one face package of ``bot/`` importing another.
* **layers with an upward import** (issue 47 item 3): ``runtime/`` is in layers, bottom to
  top ``LAYERS``; a module imports only from its own layer or one below (module-level and
  function-level imports alike, ``TYPE_CHECKING`` ones too). The count is of the pairs
  (layer, higher layer) some import connects; the listing names each import. Each module
  of ``runtime/`` in no layer is listed too, and counts as one.

The parts are read from ``runtime/engine.py``'s ``Parts`` dataclass, so a part added there is
counted without touching this script.
"""

from __future__ import annotations

import ast
import functools
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

RUNTIME = ROOT / "runtime"
# runtime/'s layers, bottom to top: each a package of runtime/, except "top", which is
# runtime/ itself (the engine and the read models the faces see; TOP_MODULES names them).
# "facade" is runtime/__init__.py, the names the docs and the faces import: above all.
LAYERS = ("kernel", "policies", "record", "requests", "approvals", "runs", "top", "facade")
TOP_MODULES = frozenset({"callers", "documents", "engine", "insights", "insights_board",
                         "replay", "threads", "trace", "views"})
# packages of runtime/ that are not layers, and the layer they sit in
KEPT = {"adapters": "runs", "models": "runs"}


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


def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s syntax tree (``ast.walk``'s order), parsed once a process
    for all the counts (again if the file changed)."""
    stat = path.stat()
    return _walked(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _walked(path: Path, mtime: int, size: int) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(path.read_text(), str(path))))


def _private_or_part(attr: str, names: set[str]) -> bool:
    return attr in names or (attr.startswith("_") and not attr.startswith("__"))


def reach_throughs(names: set[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for path in _modules(BOT):
        for node in _nodes(path):
            if isinstance(node, ast.Attribute) and _private_or_part(node.attr, names) \
                    and _ENGINE.search(ast.unparse(node.value)):
                found[str(path.relative_to(ROOT))] += 1
    return found


def transactions() -> Counter[str]:
    found: Counter[str] = Counter()
    for path in _modules(BOT):
        for node in _nodes(path):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in TRANSACTIONS \
                    and _DB.search(ast.unparse(node.func.value)):
                found[str(path.relative_to(ROOT))] += 1
    return found


def _facade_names() -> set[str]:
    """The names ``runtime/__init__.py`` exports (its ``_EXPORTS`` table's keys)."""
    tree = ast.parse((RUNTIME / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id == "_EXPORTS" and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise SystemExit("runtime/__init__.py has no _EXPORTS table any more: update this script")


def past_the_facade() -> Counter[str]:
    """Each import in ``bot/`` of a module inside ``approvald.runtime``, by file."""
    exported = _facade_names()
    found: Counter[str] = Counter()
    for path in _modules(BOT):
        package = ["approvald", "bot", *path.relative_to(BOT).parts[:-1]]
        for node in _nodes(path):
            if isinstance(node, ast.Import):
                deep = [a.name for a in node.names if a.name.startswith("approvald.runtime.")]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
                if module == "approvald.runtime":
                    deep = [a.name for a in node.names if a.name not in exported]
                else:
                    deep = [module] if module.startswith("approvald.runtime.") else []
            else:
                deep = []
            if deep:
                found[str(path.relative_to(ROOT))] += len(deep)
    return found


def face_imports() -> list[str]:
    crossings = []
    for face in FACES:
        others = tuple(f"approvald.bot.{o}" for o in FACES if o != face)
        for path in _modules(BOT / face):
            for node in _nodes(path):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                crossings += [f"{path.relative_to(ROOT)} imports {n}" for n in names
                              if n.startswith(others)]
    return sorted(set(crossings))


def layer_of(parts: list[str]) -> str | None:
    """The layer of ``approvald.runtime.<parts>`` (None: in no layer)."""
    if not parts:
        return "facade"
    head = parts[0]
    if head in LAYERS[:-2]:
        return head
    if head in KEPT:
        return KEPT[head]
    return "top" if head in TOP_MODULES and len(parts) == 1 else None


def _imported(path: Path, node: ast.AST) -> list[list[str]]:
    """What one import statement of runtime/<path> names, as parts after approvald.runtime."""
    prefix = "approvald.runtime"
    if isinstance(node, ast.Import):
        return [a.name.split(".")[2:] for a in node.names
                if a.name == prefix or a.name.startswith(prefix + ".")]
    if not isinstance(node, ast.ImportFrom):
        return []
    named = (node.module or "").split(".") if node.module else []
    if node.level:
        package = list(path.relative_to(RUNTIME).parts[:-1])
        if node.level - 1 > len(package):
            return []
        module = package[:len(package) - node.level + 1] + named
    elif named[:2] == ["approvald", "runtime"]:
        module = named[2:]
    else:
        return []
    out = []
    for a in node.names:  # ``from <package> import <module>`` imports the module
        target = [*module, a.name]
        found = RUNTIME.joinpath(*target)
        out.append(target if found.is_dir() or found.with_suffix(".py").is_file() else module)
    return out


def layer_crossings() -> tuple[list[tuple[str, str, str]], list[str]]:
    """Each upward import between runtime's layers, as (its layer, the higher one, where),
    and each module of runtime/ in no layer."""
    upward, unplaced = set(), []
    for path in _modules(RUNTIME):
        rel = list(path.relative_to(RUNTIME).with_suffix("").parts)
        if rel == ["__init__"]:
            continue
        own = layer_of(rel[:-1] if rel[-1] == "__init__" else rel)
        if own is None:
            unplaced.append(str(path.relative_to(ROOT)))
            continue
        for node in _nodes(path):
            for target in _imported(path, node):
                theirs = layer_of(target)
                if theirs is not None and LAYERS.index(theirs) > LAYERS.index(own):
                    name = ".".join(["approvald.runtime", *target])
                    line = getattr(node, "lineno", 0)
                    upward.add((own, theirs, f"{path.relative_to(ROOT)}:{line} ({own}) "
                                             f"imports {name} ({theirs})"))
    return sorted(upward), unplaced


def layers_with_an_upward_import(upward: list[tuple[str, str, str]], unplaced: list[str]) -> int:
    """The pairs (layer, higher layer) some import connects, plus the modules in no layer."""
    return len({(own, theirs) for own, theirs, _ in upward}) + len(unplaced)


def figures() -> dict[str, object]:
    upward, unplaced = layer_crossings()
    reach = reach_throughs(parts())
    tx = transactions()
    deep = past_the_facade()
    return {"reach_throughs": sum(reach.values()), "reach_through_files": len(reach),
            "reach_throughs_by_file": dict(reach.most_common()),
            "transactions": sum(tx.values()), "transaction_files": len(tx),
            "transactions_by_file": dict(tx.most_common()),
            "imports_past_the_facade": sum(deep.values()),
            "imports_past_the_facade_by_file": dict(deep.most_common()),
            "face_to_face_imports": face_imports(),
            "layers_with_an_upward_import": layers_with_an_upward_import(upward, unplaced),
            "upward_imports": [where for _, _, where in upward],
            "modules_in_no_layer": unplaced}


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
    print(f"imports past the runtime's facade in bot/: {found['imports_past_the_facade']}")
    for path, n in found["imports_past_the_facade_by_file"].items():  # type: ignore[attr-defined]
        print(f"  {n:4d}  {path}")
    crossings = found["face_to_face_imports"]
    print(f"face-to-face imports: {len(crossings)}")  # type: ignore[arg-type]
    for line in crossings:  # type: ignore[attr-defined]
        print(f"  {line}")
    print(f"layers with an upward import: {found['layers_with_an_upward_import']}")
    for line in [*found["upward_imports"], *found["modules_in_no_layer"]]:  # type: ignore[misc]
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
