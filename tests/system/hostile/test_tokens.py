"""Only the canonical base64url form of a token verifies (RFC 7515: no ``=``
padding, no ``+`` or ``/``, no non-zero trailing bits in any segment); every other spelling of
the same bytes is 401 ``invalid_token`` at the proxy and changes no fence."""

from __future__ import annotations

import pytest

from lockd.tokens import InvalidToken, KeyRing, Verifier
from tests.proxy.conftest import Deployment, assert_problem, unique

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _with_dash_or_underscore(ring: KeyRing, lock: str, fence: int) -> str:
    """A token of ``ring`` whose signature segment contains ``-`` or ``_`` (most do)."""
    for i in range(200):
        token = ring.sign(lock, fence, extra={"n": i})  # Ed25519 is deterministic: vary it
        if "-" in token.split(".")[2] or "_" in token.split(".")[2]:
            return token
    raise AssertionError("no token with '-' or '_' in 200 tries")


def _variants(token: str) -> dict[str, str]:
    """Non-canonical spellings of ``token`` that decode to the very same bytes."""
    header, payload, signature = token.split(".")
    last = _ALPHABET.index(signature[-1])
    assert last & 0b1111 == 0, "an Ed25519 signature (64 bytes) leaves 4 unused bits"
    return {
        "padded signature": f"{header}.{payload}.{signature}==",
        "padded payload": f"{header}.{payload}{'=' * (-len(payload) % 4)}.{signature}",
        "standard alphabet": f"{header}.{payload}."
                             + signature.replace("-", "+").replace("_", "/"),
        "trailing bits": f"{header}.{payload}.{signature[:-1]}{_ALPHABET[last | 1]}",
        "trailing bits (high)": f"{header}.{payload}.{signature[:-1]}{_ALPHABET[last | 0b1000]}",
    }


def test_the_verifier_accepts_only_canonical_base64url():
    ring = KeyRing.generate()
    verifier = Verifier(ring.jwks())
    token = _with_dash_or_underscore(ring, "jobs/a", 7)
    assert verifier.verify(token).fence == 7
    for what, variant in _variants(token).items():
        if variant == token:
            continue  # e.g. a payload whose length needs no padding
        with pytest.raises(InvalidToken):
            verifier.verify(variant)
            pytest.fail(f"{what} verified: {variant}")


def test_the_proxy_answers_401_to_a_non_canonical_token(deployment: Deployment):
    d = deployment
    lock = "items/" + unique("canon")  # a row lock the contract policy governs (items/{key})
    token = _with_dash_or_underscore(d.ring, lock, 5)
    for what, variant in _variants(token).items():
        if variant == token:
            continue
        r = d.client.post(f"/v1/fences/{lock}/claim", headers={"Fencing-Token": variant})
        assert_problem(r, 401, "invalid_token")
        assert d.client.get(f"/v1/fences/{lock}").json()["highest"] == 0, what
    ok = d.client.post(f"/v1/fences/{lock}/claim", headers={"Fencing-Token": token})
    assert ok.status_code == 200 and ok.json()["highest"] == 5
