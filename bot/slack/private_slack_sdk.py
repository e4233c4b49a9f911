"""Every use of slack_sdk's private internals, in one place (issue 50).

A drawn card goes to Slack as ``client.api_call("chat.update", json=card)`` would send it
(see :mod:`.delivery`). ``api_call`` builds the request again for every call: the URL
joined by ``urllib.parse.urljoin``, the headers merged, the arguments copied, the
method looked up among deprecated ones (reading the environment), about 30 Python calls
a card, none of which changes between cards. :class:`JsonCalls` builds the URL and the
headers once, with slack_sdk's own functions, and sends each call through the function
``api_call`` ends in, ``_request_with_session``: the same request on the wire, the same
retry handlers consulted the same way (a rate limit, a connection error), the same
:class:`AsyncSlackResponse` validated into the same ``SlackApiError``.
``tests/unit/test_slack_json_calls.py`` holds the two to the same bytes and outcomes.

What is relied on, listed in :data:`RELIES_ON` (checked by that test, and by
:func:`missing` where the face is built: a name gone means ``api_call`` for every call,
with a warning): ``slack_sdk.web.internal_utils._get_url`` and ``_get_headers`` (the URL
and the headers ``api_call`` makes) and ``slack_sdk.web.async_internal_utils.
_request_with_session`` (what ``api_call`` sends through). A client whose class changes
how ``api_call`` sends (a subclass overriding ``api_call``, ``_send`` or ``_request``),
or that adds default parameters (a team id), gets ``api_call`` itself. Off with
``APPROVALD_SLACK_FAST_PATH=0``. Versions: see pyproject.toml.
"""

from __future__ import annotations

import logging
from importlib import import_module
from importlib.metadata import version
from typing import Any

from slack_sdk.web.async_base_client import AsyncBaseClient
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

# (module, name): the names this module uses that slack_sdk does not document
RELIES_ON: tuple[tuple[str, str], ...] = (
    ("slack_sdk.web.internal_utils", "_get_url"),
    ("slack_sdk.web.internal_utils", "_get_headers"),
    ("slack_sdk.web.async_internal_utils", "_request_with_session"),
)


# the logger AsyncSlackResponse's constructor looks up by name for every response (its
# module's: logging.getLogger takes the logging lock each time), looked up once
_RESPONSE_LOGGER = logging.getLogger(AsyncSlackResponse.__module__)


def response(*, client: AsyncWebClient, http_verb: str, api_url: str,
             req_args: dict[str, Any], data: dict[str, Any] | bytes,
             headers: Any, status_code: int) -> AsyncSlackResponse:
    """``AsyncSlackResponse(client=..., ...)``: the same object, its attributes as that
    constructor sets them, without the logger's look-up by name
    (``tests/unit/test_slack_json_calls.py`` compares the two)."""
    made: AsyncSlackResponse = AsyncSlackResponse.__new__(AsyncSlackResponse)
    made.__dict__.update(http_verb=http_verb, api_url=api_url, req_args=req_args, data=data,
                         headers=headers, status_code=status_code, _initial_data=data,
                         _iteration=None, _client=client, _logger=_RESPONSE_LOGGER)
    return made


def dependency() -> str:
    """The dependency this module reaches into, with its installed version."""
    return f"slack_sdk {version('slack_sdk')}"


def missing() -> list[str]:
    """The names of :data:`RELIES_ON` the installed slack_sdk lacks (none: all there)."""
    return [f"{module}.{name}" for module, name in RELIES_ON
            if not callable(getattr(import_module(module), name, None))]


def _private(module: str, name: str) -> Any:
    return getattr(import_module(module), name)


class JsonCalls:
    """``client.api_call(method, json=args)``, its request built once per method."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._get_url = _private(*RELIES_ON[0])
        self._get_headers = _private(*RELIES_ON[1])
        self._request = _private(*RELIES_ON[2])
        self._urls: dict[tuple[str, str], str] = {}
        self._headers: tuple[Any, dict[str, str]] | None = None
        cls = type(client)
        # a class that sends otherwise than AsyncBaseClient keeps its own way
        self._plain = all(getattr(cls, name) is getattr(AsyncBaseClient, name)
                          for name in ("api_call", "_send", "_request"))

    async def call(self, method: str, args: dict[str, Any]) -> AsyncSlackResponse:
        client = self.client
        if not self._plain or client.default_params or "token" in args:
            return await client.api_call(method, json=args)
        url = self._urls.get((client.base_url, method))
        if url is None:
            url = self._urls[(client.base_url, method)] = self._get_url(client.base_url,
                                                                        method)
        # api_call's headers: the client's (its token, its User-Agent), a JSON body's
        key = (client.token, tuple(client.headers.items()))
        if self._headers is None or self._headers[0] != key:
            own = dict(client.headers)
            self._headers = key, self._get_headers(headers=own, token=client.token,
                                                   has_json=True, has_files=False,
                                                   request_specific_headers=own)
        # the arguments api_call hands on once it has built them (files taken out)
        req_args = {"headers": dict(self._headers[1]), "data": None, "params": None,
                    "json": args, "ssl": client.ssl, "proxy": client.proxy, "auth": None}
        res = await self._request(current_session=client.session, timeout=client.timeout,
                                  logger=client.logger, http_verb="POST", api_url=url,
                                  req_args=req_args, retry_handlers=client.retry_handlers)
        made = response(client=client, http_verb="POST", api_url=url, req_args=req_args,
                        **res)
        made.validate()  # type: ignore[no-untyped-call]  # raises SlackApiError
        return made
