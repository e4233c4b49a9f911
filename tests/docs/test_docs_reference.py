"""The reference pages cannot drift from the code: they are regenerated in memory from the
parser, the settings model, the metrics registry, the OpenAPI document, the ``--json``
builders, the policy models and the exit codes, and compared with the committed files.

Beyond the byte comparison, the three lists a reader relies on most are checked both ways
by name: every CLI option, setting and metric in the code is in its page, and every one a
page lists still exists. Each failure says to run ``python docs/gen_reference.py``.

The module's tests run on one xdist worker (``xdist_group``, --dist loadgroup): four of them
render every page, and the generator reads the code's source once a process (about 1 s of
CPU), so the renders after the first cost a tenth of it, not a second each on other workers.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any

import pytest

from tests.docs.reference_pages import (
    REGENERATE,
    ROOT,
    committed,
    documented_metrics,
    documented_options,
    documented_settings,
    generator,
)

pytestmark = pytest.mark.xdist_group("docs_reference")

gen = generator()


def drift(code: set[Any], page: set[Any], what: str, page_name: str) -> list[str]:
    problems = []
    for name in sorted(code - page):
        problems.append(f"{what} {' '.join(name) if isinstance(name, tuple) else name} is in "
                        f"the code but not in docs/reference/{page_name}")
    for name in sorted(page - code):
        problems.append(f"{what} {' '.join(name) if isinstance(name, tuple) else name} is in "
                        f"docs/reference/{page_name} but no longer in the code")
    return problems


def option_drift(page_text: str) -> list[str]:
    return drift(gen.option_names(), documented_options(page_text), "option", "cli.md")


def test_the_committed_reference_pages_are_the_ones_the_code_generates() -> None:
    fresh = gen.pages()
    assert set(fresh) == {"cli.md", "settings.md", "metrics.md", "http-api.md",
                          "json-documents.md", "policy-file.md", "exit-codes.md"}
    stale = []
    for name, text in fresh.items():
        old = committed(name)
        if old != text:
            diff = "".join(list(difflib.unified_diff(
                old.splitlines(keepends=True), text.splitlines(keepends=True),
                f"docs/reference/{name} (committed)", f"{name} (from the code)", n=1))[:40])
            stale.append(f"docs/reference/{name} is out of date:\n{diff}")
    assert not stale, f"{REGENERATE}\n\n" + "\n".join(stale)


def test_every_cli_option_is_in_the_reference_and_every_documented_one_exists() -> None:
    problems = option_drift(committed("cli.md"))
    assert not problems, "\n".join([*problems, REGENERATE])
    # the whole parser is there: every command, its subcommands and its options
    assert len(gen.option_names()) > 80


def test_every_setting_is_in_the_reference_and_every_documented_one_exists() -> None:
    problems = drift(gen.setting_names(), documented_settings(committed("settings.md")),
                     "setting", "settings.md")
    assert not problems, "\n".join([*problems, REGENERATE])
    assert "APPROVALD_DATABASE_URL" in gen.setting_names()


def test_every_metric_is_in_the_reference_and_every_documented_one_exists() -> None:
    problems = drift(gen.metric_names(), documented_metrics(committed("metrics.md")),
                     "metric", "metrics.md")
    assert not problems, "\n".join([*problems, REGENERATE])
    assert "approvald_decisions_total" in gen.metric_names()


# -- the checks catch drift both ways ---------------------------------------------------------

def test_an_option_added_to_the_parser_and_not_to_the_page_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    build = gen.build_parser

    def with_a_new_option() -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = build()
        for path, _help, sub in gen.commands(parser):
            if path == ("runs", "list"):
                sub.add_argument("--brand-new", help="not documented yet")
        return parser

    monkeypatch.setattr(gen, "build_parser", with_a_new_option)
    problems = option_drift(committed("cli.md"))
    assert problems == ["option runs list --brand-new is in the code but not in "
                        "docs/reference/cli.md"]
    assert "cli.md" in gen.stale()


def test_an_option_the_page_lists_that_the_parser_lost_is_named() -> None:
    page = committed("cli.md").replace(
        "| `--dry-run` | flag |", "| `--dry-run` | flag |\n| `--gone-option` | flag |", 1)
    assert option_drift(page) == ["option prune --gone-option is in docs/reference/cli.md "
                                  "but no longer in the code"]


def test_a_setting_or_metric_on_one_side_only_is_named() -> None:
    settings = committed("settings.md").replace("## APPROVALD_LOG_LEVEL\n", "")
    assert drift(gen.setting_names(), documented_settings(settings + "\n## APPROVALD_GONE\n"),
                 "setting", "settings.md") == [
        "setting APPROVALD_LOG_LEVEL is in the code but not in docs/reference/settings.md",
        "setting APPROVALD_GONE is in docs/reference/settings.md but no longer in the code"]
    metrics = committed("metrics.md").replace("| `approvald_runs` |", "| `approvald_gone` |")
    assert drift(gen.metric_names(), documented_metrics(metrics), "metric", "metrics.md") == [
        "metric approvald_runs is in the code but not in docs/reference/metrics.md",
        "metric approvald_gone is in docs/reference/metrics.md but no longer in the code"]


def test_the_check_mode_of_the_generator_says_what_to_run(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen.main(["--check"]) == 0
    monkeypatch.setattr(gen, "render_exit_codes", lambda: "changed\n")
    monkeypatch.setitem(gen.PAGES, "exit-codes.md", gen.render_exit_codes)
    assert gen.main(["--check"]) == 1
    assert "docs/reference/exit-codes.md is out of date: run `python docs/gen_reference.py`" \
        in capsys.readouterr().err


def test_the_exit_codes_page_has_each_code_the_command_line_returns() -> None:
    codes = dict(gen.exit_codes())
    assert {0, 1, 2, 3, 4, 5, 6, 70} <= set(codes)
    assert "audit log" in codes[5]
    returned = gen.returned_codes()
    assert {0, 1, 2, 3, 4, 5, 6, 70, 130} <= returned
    signalled = {c for c in returned if c > 128}
    undocumented = sorted(returned - set(codes) - signalled)
    assert not undocumented, (
        f"the command line returns exit codes {undocumented} that its docstring's "
        "'Exit codes:' sentence does not define (add them there, then "
        f"{REGENERATE.removeprefix('run ')})")
    assert signalled <= {128 + 2, 128 + 15}, signalled


def test_every_variable_the_product_names_is_on_the_settings_page() -> None:
    """A variable named in the code (APPROVALD_*, SLACK_*, OPENAI_*, OTEL_*) is a setting of
    the settings model or declared in an ``ENVIRONMENT`` of a module the generator reads:
    one read with os.environ somewhere and documented nowhere fails here."""
    import ast
    import re

    named = {r["env"] for r in gen.setting_rows()} | {n for n, _ in gen.other_environment()}
    variable = re.compile(r"(APPROVALD|OPENAI|OTEL|SLACK)_[A-Z0-9_]+")
    missing: dict[str, str] = {}
    for folder in ("bot", "runtime", "store"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and variable.fullmatch(node.value) and node.value not in named:
                    missing.setdefault(node.value, str(path.relative_to(ROOT)))
    assert missing == {}, f"not on docs/reference/settings.md: {missing}"
