"""One binding key, one function (issue 46 item 1; runtime/kernel/binding.py).

The deployment's key is made once per database and read the same by every process; a
binding is keyed (a plain digest never comes out of :func:`binding.shown`); what comes
back is matched as a binding, and as a plain digest only where the one giving it holds
the arguments. And no face shows a digest some other way: the product's code is walked
for the constructions that did.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

import pytest
from approvald.runtime.kernel import binding
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.kernel.ids import TokenSigner
from approvald.store.db import Database

from tests.helpers import Rows

ROOT = Path(__file__).resolve().parents[2]
DIGEST = call_digest("withdraw", {"account": "AC-77", "pin": "4821"})


@pytest.fixture(autouse=True)
def _key_put_back():  # type: ignore[no-untyped-def]
    before = binding.current()
    yield
    binding.configure(before)


async def test_the_key_is_made_once_per_database_and_read_the_same_by_every_process(
        db: Database, db_url: str, clock: ManualClock) -> None:
    first = await binding.deployment_key(db, now=clock.now())
    other = Database(db_url, server_time=False)  # another process on the same database
    try:
        again = await binding.deployment_key(other, now=clock.now())
    finally:
        await other.close()
    assert first.key == again.key and len(first.key) == 32
    stored = await Rows(db).in_one_read(
        lambda tx: tx.keys.get_or_add(binding.KEY_NAME, secret="ignored", now=clock.now()))
    # what is stored is the secret the key is derived from, never the key itself
    assert bytes.fromhex(stored) != first.key
    assert binding.BindingKey.derive(bytes.fromhex(stored), source="x").key == first.key


def test_a_binding_is_keyed_and_never_the_plain_digest() -> None:
    one = binding.BindingKey.derive(b"k" * 32, source="one")
    two = binding.BindingKey.derive(b"j" * 32, source="two")
    assert one.binding(DIGEST) != two.binding(DIGEST)
    binding.configure(one)
    shown = binding.shown(DIGEST)
    assert shown == one.binding(DIGEST) and len(shown) == 64
    assert shown != DIGEST and DIGEST[:12] not in shown
    assert shown != hashlib.sha256(DIGEST.encode()).hexdigest()
    assert binding.short(DIGEST) == shown[:12] and binding.short("") == ""
    # the label separates it from every other use of the same secret
    assert one.key != hashlib.sha256(b"k" * 32).digest()


def test_a_binding_is_hmac_sha256_of_the_digest_as_every_version_showed_it() -> None:
    """What a caller was shown (and sends back, or a button token carries) stays the same
    value whichever process, of whichever version, works it out again."""
    one = binding.BindingKey.derive(b"k" * 32, source="one")
    for digest in (DIGEST, "0" * 64, hashlib.sha256(b"x").hexdigest()):
        assert one.binding(digest) == hmac.new(one.key, digest.encode("ascii"),
                                               hashlib.sha256).hexdigest()


def test_what_comes_back_names_the_arguments_by_binding_and_plain_only_where_allowed() -> None:
    binding.configure(binding.BindingKey.derive(b"k" * 32, source="test"))
    shown = binding.shown(DIGEST)
    assert binding.matches(shown, DIGEST) and binding.matches(shown[:12].upper(), DIGEST)
    assert not binding.matches(DIGEST, DIGEST) and not binding.matches(DIGEST[:12], DIGEST)
    assert binding.matches(DIGEST[:12], DIGEST, plain=True)
    for bad in ("", "  ", "xyz", shown + "0", "g" * 12):
        assert not binding.matches(bad, DIGEST, plain=True)


def test_recorded_details_show_digests_of_arguments_as_bindings_and_keep_the_policys() -> None:
    binding.configure(binding.BindingKey.derive(b"k" * 32, source="test"))
    details = {"previous_digest": DIGEST, "original_digest": DIGEST, "policy_digest": "p1",
               "masked": {"args": DIGEST}, "digest": "policy-file-digest",
               "packet": {"edited_impact": {"digest": DIGEST, "asked_digest": DIGEST}},
               "list": [{"args_digest": DIGEST}],
               "scope_value": {"kind": "exact", "digest": DIGEST, "values": {}}}
    shown = binding.shown_details(details)
    assert DIGEST not in repr(shown)
    assert shown["previous_digest"] == binding.shown(DIGEST) == shown["masked"]["args"]
    assert shown["packet"]["edited_impact"]["digest"] == binding.shown(DIGEST)
    assert shown["list"][0]["args_digest"] == binding.shown(DIGEST)
    assert shown["scope_value"]["digest"] == binding.shown(DIGEST)  # a standing approval's
    assert (shown["policy_digest"], shown["digest"]) == ("p1", "policy-file-digest")


def test_a_button_token_shows_a_binding_and_binds_the_digest_whatever_key_shows_it() -> None:
    signer = TokenSigner("s" * 32)
    binding.configure(binding.BindingKey.derive(b"k" * 32, source="a"))
    token = signer.token("a1", "n1", DIGEST)
    assert token.startswith(binding.short(DIGEST) + ".") and DIGEST[:12] not in token
    # another process (another key shows it) still verifies the card: the HMAC binds
    binding.configure(binding.BindingKey.derive(b"j" * 32, source="b"))
    assert signer.check("a1", "n1", token, digest=DIGEST, original=DIGEST) == "ok"
    other = call_digest("withdraw", {"account": "AC-77", "pin": "0000"})
    assert signer.check("a1", "n1", token, digest=other, original=DIGEST) == "stale"
    assert signer.check("a1", "n2", token, digest=DIGEST, original=DIGEST) == "bad"
    assert signer.check("a1", "n1", token[:-2] + "xx", digest=DIGEST,
                        original=DIGEST) == "bad"


# -- no face shows a digest another way ------------------------------------------------

# slicing a digest for display, or printing one whole, where a face draws
SHOWN = re.compile(r"digest\)?\[:\d+\]|[\"']digest[\"']: (?:a|r|rec|v)\.\w*digest\b")
# where a digest is sliced for another reason, and why: (file, what the line holds)
ALLOWED = {
    ("runtime/kernel/ids.py", "digest[:DIGEST_PREFIX]"): "the token form of earlier versions, "
                                                 "verified for cards posted before them",
    ("runtime/record/audit.py", "({digest[:16]}…)"): "the audit chain's head, not of arguments",
    ("runtime/record/audit_checkpoint.py", "({digest[:16]}…)"): "the chain's entry hash verified "
                                                          "through, not of arguments",
    ("runtime/runs/demo.py", '"rf_" + digest[:12]'): "the demo's refund id, of its idempotency key",
    ("runtime/runs/external.py", "args_digest[:64]!r}"): "what the caller sent, quoted back to it",
    ("bot/trace_view.py", "{v.digest[:12]}"): "a trace's votes hold bindings (runtime/trace.py)",
    ("bot/cli/policy.py", "new.digest[:16]"): "a policy file's SHA-256, not of arguments",
    ("bot/cli/policy.py", "{digest[:16]}…)"): "the audit chain's head, not of arguments",
}


def test_no_face_shows_a_digest_except_through_the_binding() -> None:
    found = []
    for folder in ("bot", "runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "runtime/kernel/binding.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if SHOWN.search(line) and not any(
                        f == rel and what in line for f, what in ALLOWED):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
