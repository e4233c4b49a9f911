"""Kill switches: a face, or one form of it, switched off by the operator and on again.

Claude Code's hook has two forms: the command every laptop runs (``approvald hook
claude-code``, under approvald's own credential ``hook.claude-code``) and the HTTP hook
(``POST /v1/hooks/claude-code``, each person with a token of their own). Switching a form
off makes it deny every call, saying who switched it off, when and why, and how to switch
it on again; switching it on again deletes the switch. Both are grants and withdrawals of
authority, so both are audited (``face_disabled``, ``face_enabled``, with what the switch
covers). A person's own HTTP hook token is still revoked by its name (``approvald tokens
revoke NAME``): that stops that person, and nobody else.

Before switches existed, revoking ``hook.claude-code`` was the documented way to switch
the hook off, for both forms and for good. Such a revocation still switches both off; it
is cleared by switching them on again (audited with the rest).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from approvald.runtime.kernel.errors import ApprovaldError

if TYPE_CHECKING:  # imported where used: the hook's command line reads the forms only
    from approvald.runtime.kernel.clock import Clock
    from approvald.runtime.policies.intake import Source
    from approvald.runtime.record.audit import AuditTrail
    from approvald.store.db import Database
    from approvald.store.repos import Tx
    from approvald.store.repos.external import SwitchRecord, TokenRecord

HOOK = "hook:claude-code"
# each form of a face with a switch, and what switching it off covers
COVERS = {
    "command": "the command hook (`approvald hook claude-code`), on every machine that runs "
               "it against this database",
    "http": "the HTTP hook (POST /v1/hooks/claude-code), for every person's token",
}
FORMS = tuple(COVERS)
FACES = {HOOK: FORMS}


def check(face: str, forms: Sequence[str]) -> list[str]:
    """``forms`` of ``face`` (each once), or a clear error naming what there is."""
    known = FACES.get(face)
    if known is None:
        raise ApprovaldError(f"no face {face!r} has a switch (one of: {', '.join(FACES)})")
    bad = [f for f in forms if f not in known]
    if bad or not forms:
        raise ApprovaldError(f"{face} has the forms {', '.join(known)}: got "
                             f"{', '.join(bad) or 'none'}")
    return list(dict.fromkeys(forms))


class Switches:
    """The kill switches of the faces that have them (see the module docstring)."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail) -> None:
        self.db = db
        self.clock = clock
        self.audit = audit

    async def disable(self, face: str, forms: Sequence[str], *, by: str, via: str,
                      reason: str | None = None) -> list[SwitchRecord]:
        """Switch ``forms`` of ``face`` off (those already off stay as they were); audited.
        Returns the forms now off."""
        wanted = check(face, forms)
        if reason is not None and not 1 <= len(reason) <= 500:
            raise ApprovaldError("--reason is 1-500 characters")
        async with self.db.write() as tx:
            now = self.clock.now()
            for form in wanted:
                if await tx.external.switch_off(face, form, by=by, now=now, reason=reason):
                    self.audit.record(tx, at=now, action="face_disabled", actor=by, via=via,
                                      details={"face": face, "form": form, "reason": reason,
                                               "covers": COVERS[form]})
            return await tx.external.switches(face)

    async def enable(self, face: str, forms: Sequence[str], *, by: str,
                     via: str) -> list[SwitchRecord]:
        """Switch ``forms`` of ``face`` on again; audited. Returns the switches they were off
        by. A revocation of the face's own credential from before switches existed (every
        form off) is cleared: the forms not named stay off, by a switch of their own."""
        from approvald.runtime.policies.intake import Source

        wanted = check(face, forms)
        source = Source.of_face(face)
        async with self.db.write() as tx:
            now = self.clock.now()
            legacy = await _legacy(tx, source)
            if legacy is not None:  # what it switched off, as switches: then it is cleared
                for form in FACES[face]:
                    if form not in wanted:
                        await tx.external.switch_off(face, form, by=legacy.off_by,
                                                     now=legacy.off_at, reason=legacy.reason)
                await tx.external.unrevoke_token(source.credential)
            was: list[SwitchRecord] = []
            for form in wanted:
                found = await tx.external.switch_on(face, form) or legacy
                if found is None:
                    continue
                was.append(found)
                self.audit.record(tx, at=now, action="face_enabled", actor=by, via=via,
                                  details={"face": face, "form": form, "covers": COVERS[form],
                                           "off_since": found.off_at.isoformat(),
                                           "off_by": found.off_by})
            return was

    async def off(self, face: str, form: str, *,
                  credential: TokenRecord) -> SwitchRecord | None:
        """Why ``form`` of ``face`` lets nothing through now (None: it is on); ``credential``
        is the face's own, as just read."""
        from approvald.runtime.policies.intake import Source

        legacy = _revoked(credential, Source.of_face(face))
        if legacy is not None:
            return legacy
        async with self.db.read() as tx:
            found = [s for s in await tx.external.switches(face) if s.form == form]
        return found[0] if found else None

    async def state(self, face: str) -> dict[str, SwitchRecord | None]:
        """Each form of ``face``: the switch it is off by, or None when it is on."""
        from approvald.runtime.policies.intake import Source

        forms = check(face, FACES.get(face, ()))
        async with self.db.read() as tx:
            found = {s.form: s for s in await tx.external.switches(face)}
            legacy = await _legacy(tx, Source.of_face(face))
        return {f: found.get(f) or legacy for f in forms}


async def _legacy(tx: Tx, source: Source) -> SwitchRecord | None:
    """The revocation of ``source``'s own credential, made before switches existed, as
    the switch of every form it was."""
    return _revoked(await tx.external.token_named(source.credential), source)


def _revoked(token: TokenRecord | None, source: Source) -> SwitchRecord | None:
    from approvald.store.repos.external import SwitchRecord

    if token is None or token.revoked_at is None:
        return None
    return SwitchRecord(f"{source.kind}:{source.name}", "all", token.revoked_at,
                        token.revoked_by or "?", f"its credential {token.name} was revoked")
