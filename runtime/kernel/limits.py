"""The payload cap: how large arguments, results, tasks and states may be."""

from __future__ import annotations

from dataclasses import dataclass

from approvald.runtime.kernel.errors import PayloadTooLarge

DEFAULT_MAX_PAYLOAD = 256 * 1024


@dataclass(frozen=True)
class PayloadCap:
    """``check`` raises :class:`PayloadTooLarge` (naming ``what``) for text over the cap."""

    max_bytes: int = DEFAULT_MAX_PAYLOAD

    def check(self, text: str, *, what: str) -> None:
        size = len(text.encode())
        if size > self.max_bytes:
            raise PayloadTooLarge(f"{what} is {size} bytes, over the {self.max_bytes}-byte cap")
