"""The multi-lock token format (``locks: {name: fence}``) and how it verifies.

Single-lock tokens keep their claims; a multi-lock token carries ``locks`` only; a token that
carries both, an empty or oversized map, or a non-positive fence is refused."""

from __future__ import annotations

import base64
import json

import pytest

from lockd.tokens import MAX_LOCKS, MAX_TOKEN_CHARS, InvalidToken, KeyRing, multi_token_fits


def _claims_of(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_a_multi_lock_token_verifies_to_every_lock_and_fence():
    ring = KeyRing.generate()
    token = ring.sign_many({"accounts/2": 7, "accounts/1": 3})
    claims = ring.verifier().verify(token)
    assert claims.multi and claims.lock is None and claims.fence is None
    assert dict(claims.locks) == {"accounts/1": 3, "accounts/2": 7}
    assert claims.fence_for("accounts/2") == 7 and claims.fence_for("accounts/3") is None
    assert list(_claims_of(token)["locks"]) == ["accounts/1", "accounts/2"]  # written sorted


def test_a_single_lock_token_keeps_its_claims_and_maps_its_one_lock():
    ring = KeyRing.generate()
    claims = ring.verifier().verify(ring.sign("jobs/a", 5))
    assert (claims.lock, claims.fence, claims.multi) == ("jobs/a", 5, False)
    assert dict(claims.locks) == {"jobs/a": 5}
    assert "locks" not in _claims_of(ring.sign("jobs/a", 5))


@pytest.mark.parametrize("locks", [{}, {f"l/{i}": 1 for i in range(MAX_LOCKS + 1)}])
def test_sign_many_refuses_an_empty_or_oversized_set(locks):
    with pytest.raises(ValueError):
        KeyRing.generate().sign_many(locks)


@pytest.mark.parametrize(
    "extra",
    [
        {"lock": "a", "fence": 1},            # both forms in one token
        {"locks": {}},                         # empty
        {"locks": ["a", "b"]},                 # not an object
        {"locks": {"a": 0}},                   # fence below 1
        {"locks": {"a": True}},                # a bool is not a fence
        {"locks": {"a": "3"}},                 # nor is a string
        {"locks": {"": 2}},                    # empty name
        {"locks": {f"l/{i}": 1 for i in range(MAX_LOCKS + 1)}},
    ],
)
def test_malformed_multi_lock_claims_are_refused(extra):
    ring = KeyRing.generate()
    claims = {"iss": "lockd", "iat": 0, **extra}
    if "lock" not in extra:
        claims.setdefault("locks", {"a": 1})
        token = ring._sign_claims(claims)
    else:
        token = ring._sign_claims({**claims, "locks": {"b": 2}})
    with pytest.raises(InvalidToken):
        ring.verifier().verify(token)


def test_multi_token_fits_is_a_safe_and_tight_bound_on_the_token_length():
    """lockd refuses a set whose token might exceed what the verifier reads: every set the
    bound admits signs (with the largest fences) to a token that verifies, and the first set it
    refuses would have come close to the limit (the bound wastes little)."""
    ring = KeyRing.generate()
    largest = 2**63 - 1
    admitted = refused = None
    for length in range(1, 256):
        names = [f"{i:02d}" + "n" * length for i in range(MAX_LOCKS)]
        token = ring.sign_many({name: largest for name in names})
        if multi_token_fits(names):
            assert len(token) <= MAX_TOKEN_CHARS
            assert ring.verifier().verify(token).fence_for(names[0]) == largest
            admitted = len(token)
        else:
            refused = len(token)
            break
    assert admitted is not None and refused is not None
    assert refused > MAX_TOKEN_CHARS - 400, (admitted, refused)
    with pytest.raises(InvalidToken):
        ring.verifier().verify(ring.sign_many({"a" * (MAX_TOKEN_CHARS + 1): 1}))
