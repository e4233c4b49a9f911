"""What ``pip install approvald`` puts on a user's sys.path: ``approvald`` and nothing else.

The folders bot/, runtime/ and store/ are installed as approvald.bot, approvald.runtime and
approvald.store, so a team's own ``store.py`` (or ``bot.py``, ``runtime.py``) beside its
agents is its own, never approvald's, and approvald's packages are never the user's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"approvald.bot": "bot", "approvald.runtime": "runtime", "approvald.store": "store"}


def test_every_package_folder_is_listed_and_nothing_else() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == FOLDERS
    found = set()
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert set(config["packages"]) == found, "list every package folder in pyproject.toml"


# the tests that install the wheel run on one xdist worker, which builds it once
pytestmark = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the checkout: setuptools writes ``build/`` and
    ``approvald.egg-info`` into the tree it builds, so two builds of one tree at once (two
    workers, or a developer's own ``pip install .``) broke each other ("No such file or
    directory" while copying the egg-info)."""
    out = tmp_path_factory.mktemp("wheel")
    src = tmp_path_factory.mktemp("source") / "approvald"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "node_modules", "build", "*.egg-info", "__pycache__", ".*cache"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [built] = out.glob("approvald-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_installs_approvald_and_no_other_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/", 1)[0] for n in z.namelist()}
        names = z.namelist()
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"approvald"}
    for data in ("approvald/bot/sandbox/policy.toml", "approvald/store/migrations/script.py.mako",
                 "approvald/store/migrations/versions/0001_initial_schema.py"):
        assert data in names


@pytest.mark.slow
def test_a_users_own_store_module_beside_their_agents_is_theirs(wheel: Path,
                                                                 tmp_path: Path) -> None:
    """Installed from the wheel (and only from it: no editable install, no checkout on the
    path), approvald imports as approvald.*; ``import store`` is the user's store.py."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                           "--target", str(target), str(wheel)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    work = tmp_path / "work"
    work.mkdir()
    (work / "store.py").write_text("WHOSE = 'the team'\n")
    (work / "bot.py").write_text("WHOSE = 'the team'\n")
    (work / "myagents.py").write_text(textwrap.dedent('''
        import bot
        import store
        from approvald.runtime.runs.agent import Agent
        from approvald.runtime.models.scripted import ScriptedModel

        assert store.WHOSE == bot.WHOSE == "the team", (store, bot)
        AGENTS = [Agent(name="mine", instructions="", model=ScriptedModel([]), tools=[])]
        '''))
    probe = textwrap.dedent(f'''
        import importlib, sys
        sys.path[:0] = [{str(work)!r}, {str(target)!r}]
        import approvald.runtime, approvald.store, approvald.bot
        assert approvald.runtime.__file__.startswith({str(target)!r}), approvald.runtime.__file__
        for name in ("runtime",):
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                pass
            else:
                raise SystemExit(f"{{name}} is importable")
        from approvald.runtime.runs.agent import Registry
        r = Registry()
        r.load_modules("myagents")
        print(r.names())
        ''')
    # -S: no site, so no .pth file (the editable install of this checkout) is read; the
    # dependencies come from this environment's site-packages as a plain path
    deps = sysconfig.get_paths()["purelib"]
    ran = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True,
                         cwd=work, env={"PYTHONPATH": deps, "PATH": "/usr/bin:/bin"},
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "['mine']"
