"""A request aiohttp cannot parse is the client's error, answered ``400``: one log line.

aiohttp answers a malformed request (a NUL in a header, a broken request line, a header
too long) with 400 and then logs it on ``aiohttp.server`` at ERROR with a full traceback,
so anyone who can reach a listener can fill its log with tracebacks. Every listener of
``serve`` and the sandbox installs :func:`quiet_malformed_requests`: such a record becomes
one INFO line naming the peer, the status and what was wrong. Any other error aiohttp logs
(a bug in a handler) keeps its traceback.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

LOGGER = "aiohttp.server"


class MalformedRequest(logging.Filter):
    """Turns aiohttp's record of a request it could not parse into one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            said = [line.strip() for line in str(exc.message or "").splitlines()
                    if line.strip()]
            record.args = (record.getMessage(), exc.code,
                           said[0] if said else type(exc).__name__)
            record.msg = "%s: a malformed HTTP request, answered %s (%s)"
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def quiet_malformed_requests() -> None:
    """Install :class:`MalformedRequest` on aiohttp's server logger (once)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, MalformedRequest) for f in logger.filters):
        logger.addFilter(MalformedRequest())
