"""Every shell and Python example in the docs runs (see ``tests/docs/examples.py`` for what
counts as one, and the ``<!-- not-run: reason -->`` and ``<!-- expect-exit: N -->`` markers).

One test per page of ``docs/**/*.md``; each prints the blocks it ran and the ones the page
says not to run, with the reason (``pytest tests/docs/test_docs_examples.py -rP`` shows the
list). A block that fails names its page and line, with its output. The fixture page
``tests/docs/fixtures/examples.md`` shows each rule at work.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.examples import LOG, Block, MarkerError, blocks, run_page

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FIXTURE = Path(__file__).parent / "fixtures" / "examples.md"
PAGES = sorted(DOCS.rglob("*.md"))


def report(page: Path, workdir: Path) -> list[str]:
    """Run a page's examples; assert each exits as expected; the lines listing them."""
    ran, skipped = run_page(page, workdir)
    lines = [("saved and ran: " if r.block.save_as else "ran: ") + r.block.where(ROOT) + (
        "" if r.status == r.block.expect_exit == 0 else f", exit {r.status}" + (
            " as expected" if r.status == r.block.expect_exit else
            f", not {r.block.expect_exit}: FAILED")) for r in ran]
    for b in sorted(skipped, key=lambda b: b.line):
        if b.run_by is not None:
            test = ROOT / b.run_by
            page_name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name
            assert test.is_file() and page_name in test.read_text(encoding="utf-8"), (
                f"{b.where(ROOT)}: run-by {b.run_by}, but that file does not exist or does "
                f"not name {page_name}")
            lines.append(f"run by {b.run_by}: {b.where(ROOT)}")
        else:
            lines.append(f"not run: {b.where(ROOT)}: {b.not_run}")
    shown = lines or [f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}: "
                      "no shell or Python examples"]
    print("\n".join(shown))
    if page.is_relative_to(DOCS):
        LOG.extend(shown)
    for r in ran:
        assert r.status == r.block.expect_exit, (
            f"the example at {r.block.where(ROOT)} exited {r.status}, not "
            f"{r.block.expect_exit}:\n{r.block.code}\n--- its output ---\n{r.output[-3000:]}")
    return lines


@pytest.mark.slow  # a page's examples run approvald as a reader would: evals take a minute
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_the_examples_of_a_docs_page_run(page: Path, tmp_path: Path) -> None:
    report(page, tmp_path)


def test_the_docs_have_pages() -> None:
    assert DOCS / "who-can-set-what.md" in PAGES


@pytest.mark.slow  # starts a process
def test_the_fixture_page_runs_each_kind_of_block_and_lists_them(tmp_path: Path) -> None:
    lines = report(FIXTURE, tmp_path)
    where = "tests/docs/fixtures/examples.md"
    assert lines == [f"ran: {where}:5 (bash)", f"ran: {where}:13 (python)",
                     f"ran: {where}:23 (console)",
                     f"ran: {where}:29 (sh), exit 2 as expected",
                     f"not run: {where}:37 (bash): serves until stopped",
                     f"run by tests/docs/test_docs_examples.py: {where}:44 (bash)"]
    assert (tmp_path / "note.txt").read_text() == "refund A-1001\n"
    assert (tmp_path / "home" / ".local" / "share" / "approvald" / "approvald.db").exists()
    kinds = [(b.lang, b.runnable) for b in blocks(FIXTURE)]
    assert kinds[-1] == ("toml", False)


@pytest.mark.slow  # starts a process
def test_a_failing_example_fails_naming_its_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text("# Broken\n\n```bash\necho before\napprovald runs list --limit 0\n"
                    "echo never\n```\n\n```python\nprint('not reached')\n```\n")
    with pytest.raises(AssertionError) as failed:
        report(page, tmp_path / "work")
    message = str(failed.value)
    assert f"{page}:3 (bash) exited 2, not 0" in message
    assert "--limit: must be a whole number of 1 or more" in message
    ran, _ = run_page(page, tmp_path / "again")
    assert len(ran) == 1  # the page stops at its first failure


def test_a_run_by_marker_must_name_a_test_that_names_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run-by: tests/docs/test_docs_build.py -->\n```bash\nls\n```\n")
    with pytest.raises(AssertionError, match="does not exist or does not name"):
        report(page, tmp_path / "work")


@pytest.mark.slow  # starts a process
def test_a_python_example_that_raises_fails(tmp_path: Path) -> None:
    page = tmp_path / "raises.md"
    page.write_text("```python\nraise SystemExit('the example is stale')\n```\n")
    ran, _ = run_page(page, tmp_path)
    assert ran[0].status == 1 and "the example is stale" in ran[0].output


@pytest.mark.parametrize("text, error", [
    ("<!-- not-run -->\n```bash\nls\n```\n", "not-run needs a reason"),
    ("<!-- not-run:   -->\n```bash\nls\n```\n", "not-run needs a reason"),
    ("<!-- expect-exit: two -->\n```bash\nls\n```\n", "expect-exit needs a number"),
    ("<!-- not-run: stray -->\n\nA paragraph.\n\n```bash\nls\n```\n",
     "not-run is not right before a fenced block"),
    ("<!-- run-by: somewhere -->\n```bash\nls\n```\n", "run-by names a test file"),
])
def test_a_marker_must_be_well_formed_and_right_before_its_block(
        tmp_path: Path, text: str, error: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(MarkerError, match=error):
        blocks(page)


def test_an_unmarked_block_is_never_left_out(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\ntrue\n```\n\n<!-- not-run: a fragment -->\n```python\nx\n```\n"
                    "\n```python\nprint(1)\n```\n")
    found = [b for b in blocks(page) if b.runnable]
    assert [(b.lang, b.not_run) for b in found] == [
        ("sh", None), ("python", "a fragment"), ("python", None)]
    assert isinstance(found[0], Block)


@pytest.mark.slow  # starts a process
def test_a_variable_a_block_sets_is_there_for_the_next_exported_or_not(tmp_path: Path) -> None:
    # as in the one terminal a reader pastes the page into: ID=$(…) in one block, "$ID" in
    # a later one; a function defined once, called later
    page = tmp_path / "page.md"
    page.write_text("```sh\nID=$(echo a1b2c3) && export TOKEN=apd_x && LIST=(one two)\n"
                    "cd sub 2>/dev/null || { mkdir sub && cd sub; }\n"
                    "shout() { echo \"$1!\"; }\n```\n\n"
                    "```sh\ntest \"$ID $TOKEN ${LIST[1]} $(basename \"$PWD\") $(shout hi)\" = "
                    "\"a1b2c3 apd_x two sub hi!\"\n```\n")
    ran, _ = run_page(page, tmp_path / "work")
    assert [r.status for r in ran] == [0, 0], ran[-1].output


@pytest.mark.slow  # starts a process
def test_the_readmes_own_agent_runs_as_written(tmp_path: Path) -> None:
    """README.md's "Gate your own agent" section (its other commands install packages and
    run the suite: tests/acceptance runs them in a fresh venv) is run as a docs page."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Gate your own agent"):]
    section = section[:section.index("\n## ", 1)]
    page = tmp_path / "readme-own-agent.md"
    page.write_text(section, encoding="utf-8")
    ran, skipped = run_page(page, tmp_path / "work")
    assert [r.block.lang for r in ran] == ["python", "sh"] and not skipped
    assert [r.status for r in ran] == [0, 0], ran[-1].output
    assert "completed: Paid." in ran[-1].output


@pytest.mark.slow  # starts approvald (the seed's two commands)
def test_each_page_gets_the_two_waiting_requests_seeded_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unrelated waiting requests a page's database holds are made by two ``approvald``
    processes once and copied to each page (not two processes per page); each copy holds
    both, and one seeded more than SEED_FRESH_FOR ago is made again."""
    import sqlite3

    from tests.docs import examples

    made: list[Path] = []
    real = examples.seed_database
    monkeypatch.setattr(examples, "_SEEDED", [])
    monkeypatch.setattr(examples, "seed_database",
                        lambda workdir, env: (made.append(workdir), real(workdir, env)))
    homes = [tmp_path / f"page-{i}" / "home" for i in range(3)]
    for home in homes[:2]:
        examples.seed(home.parent, examples.environment(home))
    assert len(made) == 1
    for home in homes[:2]:
        db = sqlite3.connect(home / examples.EMBEDDED_DB)
        try:
            runs = sorted(r[0] for r in db.execute("SELECT agent FROM runs"))
            waiting = [r[0] for r in db.execute(
                "SELECT requested_by FROM approvals WHERE status = 'pending'")]
        finally:
            db.close()
        # the refund's run and the Claude Code call, whose request waits
        assert runs == ["demo-refund", "external:hook.claude-code"]
        assert waiting == ["U_SEED"]
    monkeypatch.setattr(examples, "SEED_FRESH_FOR", -1.0)  # the seed has gone stale
    examples.seed(homes[2].parent, examples.environment(homes[2]))
    assert len(made) == 2


def test_the_docs_import_the_runtime_only_from_its_front_package() -> None:
    """Issue 47 item 3: runtime/ is in layers a reader need not know; the docs and the README
    import from ``approvald.runtime`` alone (its ``__init__`` names what they use), so a
    module moving between layers breaks no page."""
    deep = re.compile(r"^\s*(from approvald\.runtime\.\S+ import|import approvald\.runtime\b)")
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
             for page in [ROOT / "README.md", *PAGES]
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if deep.match(line)]
    assert found == []


@pytest.mark.slow  # starts the warm approvald and the console script
def test_the_warm_approvald_answers_as_the_console_script_does(tmp_path: Path) -> None:
    """The ``approvald`` a page's commands run (tests/zygote.py, forked from a warm
    server) is the console script's command in a process of its own: the same exit status,
    output and error; its own environment (the ``HOME`` whose embedded database it makes),
    working directory and standard input; its failpoints armed from its own environment,
    a SIGKILL seen as one."""
    import subprocess
    import sys

    from tests.docs import examples

    examples.start_warm_approvald()
    warm = str(examples._warm_bin() / "approvald")
    cold = str(Path(sys.executable).parent / "approvald")

    def both(argv: list[str], *, stdin: str | None = None, **extra: str
             ) -> list[subprocess.CompletedProcess[str]]:
        done = []
        for which, exe in (("warm", warm), ("cold", cold)):
            where = tmp_path / which
            where.mkdir(exist_ok=True)
            env = {**examples.environment(where / "home"), **extra}
            done.append(subprocess.run([exe, *argv], cwd=where, env=env, input=stdin,
                                       capture_output=True, text=True, timeout=120,
                                       check=False))
        return done

    for argv in (["runs", "list", "--limit", "0"], ["no-such-command"], ["audit", "verify"]):
        w, c = both(argv)
        assert (w.returncode, w.stdout, w.stderr.replace("/warm/", "/cold/")) == \
            (c.returncode, c.stdout, c.stderr), argv
    assert (tmp_path / "warm" / "home" / examples.EMBEDDED_DB).exists()  # its own HOME
    w, c = both(["hook", "claude-code", "--requested-by", "U_SEED", "--wait", "0"],
                stdin=examples.UNRELATED_HOOK_EVENT)
    assert w.returncode == c.returncode == 0 and '"permissionDecision"' in w.stdout
    assert w.stdout.split('"permissionDecision"')[1][:12] == \
        c.stdout.split('"permissionDecision"')[1][:12]
    w, c = both(["run", "demo-steps", "--task", "3"], APPROVALD_FAILPOINTS="after_intent")
    assert w.returncode == c.returncode == -9, (w.stderr, c.stderr)
    w, c = both(["run", "demo-steps", "--task", "3"])
    assert w.returncode == c.returncode == 0 and "completed" in w.stdout + w.stderr
