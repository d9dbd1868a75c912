"""``Verifier`` checks signatures with libsodium (PyNaCl); OpenSSL (``cryptography``) is the
oracle: both accept every token a ``KeyRing`` signs, both refuse every tampered one, and
libsodium never accepts what OpenSSL refuses (it is the stricter: non-canonical ``S``,
small-order keys)."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from lockd.tokens import InvalidToken, KeyRing, Verifier

_L = 2**252 + 27742317777372353535851777723585520400  # the order of Ed25519's base point


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _openssl_accepts(jwks: dict, token: str) -> bool:
    header, payload, signature = token.split(".")
    key = Ed25519PublicKey.from_public_bytes(_unb64(jwks["keys"][0]["x"]))
    try:
        key.verify(_unb64(signature), f"{header}.{payload}".encode())
    except InvalidSignature:
        return False
    return True


def _sodium_accepts(verifier: Verifier, token: str) -> bool:
    try:
        verifier.verify(token)
    except InvalidToken:
        return False
    return True


def _flip(text: str, index: int) -> str:
    raw = bytearray(_unb64(text))
    raw[index % len(raw)] ^= 0x01
    return _b64(bytes(raw))


def test_both_accept_every_token_a_keyring_signs_and_refuse_tampered_ones() -> None:
    ring = KeyRing.generate()
    jwks = ring.jwks()
    verifier = Verifier(jwks)
    for i in range(200):
        token = ring.sign(f"oracle/{i}", i + 1, extra={"n": i})
        assert _openssl_accepts(jwks, token) and _sodium_accepts(verifier, token)
        header, payload, signature = token.split(".")
        for bad in (f"{header}.{payload}.{_flip(signature, i)}",
                    f"{header}.{_flip(payload, i)}.{signature}",
                    f"{header}.{payload}.{_b64(_unb64(signature)[:63])}"):
            sodium = _sodium_accepts(verifier, bad)
            assert not sodium
            try:
                assert not _openssl_accepts(jwks, bad)
            except ValueError:  # OpenSSL refuses a 63-byte signature by raising
                pass


def test_a_non_canonical_signature_is_refused() -> None:
    """``S + L`` verifies the same equation; RFC 8032 requires ``S < L``: both refuse it."""
    ring = KeyRing.generate()
    jwks = ring.jwks()
    token = ring.sign("oracle/s", 1)
    header, payload, signature = token.split(".")
    raw = _unb64(signature)
    s = int.from_bytes(raw[32:], "little") + _L
    if s >= 2**256:
        pytest.skip("S + L does not fit 32 bytes for this signature")
    forged = f"{header}.{payload}.{_b64(raw[:32] + s.to_bytes(32, 'little'))}"
    assert not _openssl_accepts(jwks, forged)
    assert not _sodium_accepts(Verifier(jwks), forged)


def test_a_small_order_key_verifies_nothing() -> None:
    """The identity point as a public key: a signature (R = identity, S = 0) satisfies the
    verification equation for every message. libsodium refuses it."""
    identity = (1).to_bytes(32, "little")
    jwks = {"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "kid": "weak",
                      "x": _b64(identity)}]}
    header = _b64(json.dumps({"alg": "EdDSA", "kid": "weak", "typ": "JWT"}).encode())
    payload = _b64(json.dumps({"lock": "oracle/weak", "fence": 1}).encode())
    forged = f"{header}.{payload}.{_b64(identity + bytes(32))}"
    assert not _sodium_accepts(Verifier(jwks), forged)
