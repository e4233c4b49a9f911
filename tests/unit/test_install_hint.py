"""A missing extra is named as this installation installs it: from a checkout (approvald
is installed from one until it is published) or from a package index, read from the
installer's record of where the package came from (PEP 610's direct_url.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from approvald.bot.install import install_command
from approvald.bot.tracing import from_environment
from approvald.runtime.kernel.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


class Dist:
    """A distribution's metadata with (or without) a direct_url.json."""

    def __init__(self, direct_url: dict[str, object] | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


@pytest.mark.parametrize("direct_url, command", [
    (None, "pip install 'approvald[mcp]'"),  # from a package index, once published
    ({"url": "file:///src/approvald", "dir_info": {}}, "pip install '/src/approvald[mcp]'"),
    ({"url": "file:///src/approvald", "dir_info": {"editable": True}},
     "pip install -e '/src/approvald[mcp]'"),
    ({"url": "file:///src/my%20code/approvald", "dir_info": {}},
     "pip install '/src/my code/approvald[mcp]'"),
    ({"url": "https://github.com/x/approvald", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
     "pip install 'approvald[mcp] @ git+https://github.com/x/approvald@abc'"),
    ({"url": "https://example.com/approvald-0.1.0.tar.gz", "archive_info": {}},
     "pip install 'approvald[mcp] @ https://example.com/approvald-0.1.0.tar.gz'"),
])
def test_the_command_follows_where_approvald_came_from(
        direct_url: dict[str, object] | None, command: str) -> None:
    assert install_command("mcp", Dist(direct_url)) == command


def test_a_checkout_never_installed_says_to_install_from_it() -> None:
    assert install_command("otel", None) == \
        "pip install '.[otel]' (at the top of approvald's checkout)"


def test_a_missing_exporter_names_the_extra_as_this_checkout_installs_it() -> None:
    # the tests run from a checkout installed with pip (editable or not): the message
    # names that checkout, not a package no index has yet
    with pytest.raises(ConfigError) as failed:
        from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    message = str(failed.value)
    assert f"{ROOT}[otel]'" in message, message
    assert "'approvald[otel]'" not in message
