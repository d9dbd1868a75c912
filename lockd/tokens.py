"""Fencing tokens: compact JWS (RFC 7515) signed with Ed25519, and the JWKS that verifies them.

This is the one module that both ``lockd`` (which signs) and ``resource_proxy`` (which verifies)
import. A token is what a lock holder hands to the protected resource; it carries the lock's name
and the grant's fence, signed, so a client can neither fence a resource off by inventing a
huge number nor use one lock's token for another lock.

Format::

    header  {"alg": "EdDSA", "typ": "JWT", "kid": "<RFC 7638 thumbprint>"}
    claims  {"lock": "<name>", "fence": <int>, "iat": <unix seconds>, "iss": "lockd"}
    or, for a multi-lock lease (several locks granted at once, each with its own fence):
    claims  {"locks": {"<name>": <int>, ...}, "iat": <unix seconds>, "iss": "lockd"}

A token carries either ``lock``/``fence`` or ``locks`` (1 to ``MAX_LOCKS`` entries), never both.

Tokens carry no ``exp``: fencing must not depend on any clock. A token stays *valid* forever and is
made *useless* by a higher fence, which is the whole point of fencing.

Signing and verification use ``cryptography``'s Ed25519 directly on the compact serialization
(RFC 7515 §7.1, the same bytes PyJWT produces): the header segment of a key is encoded once, and
a verification parses the token once. Through PyJWT a verification cost about 4× the Ed25519
check itself, and the proxy verifies every new lease's token on its first write. Time claims
(``iat``) are not judged: a proxy whose clock lags lockd's must not reject a fresh token.

Keys live in a key directory as PEM files (``<kid>.pem``, mode 0600). ``KeyRing.load_or_create``
creates one Ed25519 key pair on first start and reuses it afterwards; every key in the directory is
published in the JWKS. Each key signs from a moment on: its ``signs_from`` in the directory's
``keys.json`` (written by ``lockd keys rotate``, ``lockd.server.keydir``), else its file's
modification time; the key with the latest ``signs_from`` not in the future signs. So a rotation
publishes the new key at once and lets it sign only later, after every replica re-read the
directory (``KeyRing.reload``) and so publishes it too: a proxy that refetches the JWKS on the new
``kid`` finds it at whichever replica it asks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.bindings import crypto_sign, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

__all__ = [
    "ALGORITHM",
    "MAX_LOCKS",
    "MAX_TOKEN_CHARS",
    "multi_token_fits",
    "Claims",
    "KEYS_MANIFEST",
    "KeyRing",
    "TokenError",
    "InvalidToken",
    "UnknownKey",
    "Verifier",
    "public_jwk",
    "read_key_dir",
    "read_manifest",
    "thumbprint",
    "write_private_key",
]

ALGORITHM = "EdDSA"
ISSUER = "lockd"
MAX_LOCKS = 64
"""Most locks one multi-lock lease (and so one token) may hold."""
MAX_TOKEN_CHARS = 8192
"""Longest token text the verifier reads. A token travels in one request header, and servers and
proxies commonly cap a header line at 8 KiB, so lockd never issues a longer one: a multi-lock set
whose names could make a longer token is refused up front (``multi_token_fits``)."""
_FENCE_DIGITS = 19  # a fence is a 64-bit signed integer at most
KEYS_MANIFEST = "keys.json"
"""The key directory's record of each key: ``{"keys": {kid: {"created_at", "signs_from",
"retired_at"}}}`` (unix seconds; ``lockd.server.keydir`` writes it, ``read_key_dir`` reads it)."""


class TokenError(Exception):
    """Base of every token failure; the message is safe to show a client."""


class InvalidToken(TokenError):
    """Malformed token, bad signature, wrong algorithm or missing/ill-typed claims."""


class UnknownKey(InvalidToken):
    """The token's ``kid`` is not in the verifier's key set (maybe lockd rotated; refetch)."""


@dataclass(frozen=True, slots=True)
class Claims:
    """The verified content of a token.

    ``locks`` maps every lock the token fences to its grant's fence: one entry for a single-lock
    token (then ``lock``/``fence`` name it too), 1 to ``MAX_LOCKS`` for a multi-lock token (then
    ``lock`` and ``fence`` are None and ``multi`` is True).

    ``shared``: the locks this token holds in SHARED mode (claim ``mode: "shared"`` of a
    single-lock token; claim ``shared: [names]`` of a multi-lock token). A shared lease may read
    and claim-for-read, never write; its fence is the lock's write epoch, which may be 0 (no
    exclusive grant yet). Tokens without these claims are exclusive.
    """

    lock: str | None
    fence: int | None
    kid: str
    locks: Mapping[str, int]
    multi: bool = False
    shared: frozenset[str] = frozenset()

    def mode_for(self, lock: str) -> str:
        """``"shared"`` or ``"exclusive"``: how this token holds ``lock``."""
        return "shared" if lock in self.shared else "exclusive"

    def fence_for(self, lock: str) -> int | None:
        """The fence this token carries for ``lock``, or None if it does not fence ``lock``."""
        return self.locks.get(lock)


_COMPACT = json.JSONEncoder(separators=(",", ":")).encode
"""``json.dumps(value, separators=(",", ":"))`` without building an encoder per call."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def _b64url_strict(text: str) -> bytes:
    """Decode canonical base64url (RFC 7515 §2): the ``-_`` alphabet only, no ``=`` padding,
    no non-zero unused trailing bits. Every other spelling of the same bytes is refused, so one
    token has exactly one text (a token seen, logged or compared as text means one thing)."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise InvalidToken("token is not canonical base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise InvalidToken("token is not canonical base64url") from exc
    if _b64url(raw) != text:  # a non-zero trailing bit in the last character
        raise InvalidToken("token is not canonical base64url")
    return raw


def _json_object(segment: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(segment)
    except (ValueError, RecursionError) as exc:
        raise InvalidToken(f"token {what} is malformed") from exc
    if not isinstance(doc, dict):
        raise InvalidToken(f"token {what} is malformed")
    return doc


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def thumbprint(key: Ed25519PublicKey) -> str:
    """RFC 7638 JWK thumbprint (SHA-256, base64url) of an Ed25519 public key, used as ``kid``."""
    canonical = json.dumps(
        {"crv": "Ed25519", "kty": "OKP", "x": _b64url(_raw_public(key))},
        separators=(",", ":"),
        sort_keys=True,
    )
    return _b64url(hashlib.sha256(canonical.encode()).digest())


def public_jwk(key: Ed25519PublicKey) -> dict[str, str]:
    """The public JWK (RFC 8037 OKP) of ``key``, with ``kid``, ``alg`` and ``use``."""
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": _b64url(_raw_public(key)),
        "kid": thumbprint(key),
        "alg": ALGORITHM,
        "use": "sig",
    }


def multi_token_fits(names: list[str] | tuple[str, ...]) -> bool:
    """Whether a multi-lock token for ``names`` stays within ``MAX_TOKEN_CHARS`` whatever the
    fences (up to 19 digits each) and ``iat``: checked before granting, so a lease is never
    granted with a token the verifier would refuse."""
    # {"iss":"lockd","locks":{"<name>":<fence>,...},"iat":<10-11 digits>} plus JSON escapes
    payload = 48 + sum(len(json.dumps(name)) + 2 + _FENCE_DIGITS for name in names)
    header, signature = 120, 86  # base64url of the header (with a 43-char kid); of 64 bytes
    return header + 1 + (payload * 4 + 2) // 3 + 1 + signature <= MAX_TOKEN_CHARS


class KeyRing:
    """The signing key and every published public key of one lockd.

    ``sign``/``sign_many`` sign with the current signer (``kid``): of the scheduled keys, the one
    with the latest ``signs_from`` at or before ``clock()`` (the earliest if all are later);
    ``jwks()`` lists every key, so tokens signed by an older key still verify after a rotation
    until it is retired. ``reload()`` re-reads the key directory (a ring loaded from one).
    """

    def __init__(self, signing: Ed25519PrivateKey, others: list[Ed25519PublicKey] | None = None,
                 *, clock: Callable[[], float] = time.time):
        self._clock = clock
        self.directory: Path | None = None
        self._install([(float("-inf"), signing)], list(others or []))

    def _install(self, schedule: list[tuple[float, Ed25519PrivateKey]],
                 published: list[Ed25519PublicKey] | None = None) -> None:
        """Take ``schedule`` ((signs_from, key), any order; at least one) as the signing keys
        and publish them with ``published``. Not thread-safe: call it where ``sign`` runs (lockd
        reads the files in a thread and replaces the ring on its event loop)."""
        if not schedule:
            raise ValueError("a key ring needs at least one signing key")
        ordered = sorted(schedule, key=lambda entry: entry[0])
        signers = tuple((at, thumbprint(key.public_key()), key) for at, key in ordered)
        public = [key.public_key() for _, key in ordered] + list(published or [])
        jwks = {"keys": [public_jwk(k) for k in public]}
        self._signers, self._jwks = signers, jwks
        self._pick()

    def _pick(self) -> None:
        now = self._clock()
        current = self._signers[0]
        upcoming = float("inf")
        for entry in self._signers:
            if entry[0] <= now:
                current = entry
            else:
                upcoming = entry[0]
                break
        _, kid, key = current
        header = {"alg": ALGORITHM, "kid": kid, "typ": "JWT"}  # sorted, as PyJWT writes it
        seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
        self._current = (kid, key, _b64url(json.dumps(header, separators=(",", ":")).encode()),
                         crypto_sign_seed_keypair(seed)[1])
        self._next_switch = upcoming

    def _signer(self) -> tuple[str, Ed25519PrivateKey, str, bytes]:
        if self._next_switch <= self._clock():
            self._pick()
        return self._current

    @property
    def kid(self) -> str:
        """The ``kid`` of the key that signs now."""
        return self._signer()[0]

    @property
    def _signing(self) -> Ed25519PrivateKey:
        """The private key that signs now."""
        return self._signer()[1]

    @property
    def kids(self) -> tuple[str, ...]:
        """Every published ``kid``, signers in ``signs_from`` order first."""
        return tuple(jwk["kid"] for jwk in self._jwks["keys"])

    @classmethod
    def generate(cls) -> KeyRing:
        """A fresh in-memory key pair (tests, throwaway servers)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, key_dir: str | os.PathLike[str], *,
                       clock: Callable[[], float] = time.time) -> KeyRing:
        """Load every ``*.pem`` private key in ``key_dir`` (``read_key_dir``); create the
        directory and a key if none. ``reload()`` re-reads the directory later.

        Files are written 0600 and atomically (temp file + rename), so two processes starting
        at once at worst create two valid keys. Raises ``OSError``/``ValueError`` for an
        unreadable directory or a file that is not an Ed25519 private key.
        """
        directory = Path(key_dir)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        schedule = read_key_dir(directory)
        if not schedule:
            key = Ed25519PrivateKey.generate()
            write_private_key(directory, key)
            schedule = [(time.time(), key)]
        ring = cls.__new__(cls)
        ring._clock = clock
        ring.directory = directory
        ring._install(schedule)
        return ring

    def reload(self) -> bool:
        """Re-read the key directory (``read_key_dir``, then ``replace``); returns whether the
        published keys or the signer changed. ``OSError``/``ValueError`` keep the ring as is."""
        if self.directory is None:
            return False
        return self.replace(read_key_dir(self.directory))

    def replace(self, schedule: list[tuple[float, Ed25519PrivateKey]]) -> bool:
        """Take ``schedule`` ((signs_from, key) from ``read_key_dir``) as the key set; returns
        whether the published keys or the signer changed. An empty schedule keeps the ring
        (``ValueError``: a directory that lost every key is a mistake, not a retirement)."""
        if not schedule:
            raise ValueError(f"no key left in {self.directory}: keeping the keys loaded")
        before = (self.kids, self.kid)
        self._install(schedule)
        return (self.kids, self.kid) != before

    def sign(self, lock: str, fence: int, *, extra: Mapping[str, Any] | None = None) -> str:
        """A compact JWS for a grant of ``lock`` with ``fence``; ``extra`` claims are added."""
        claims: dict[str, Any] = {"iss": ISSUER, "lock": lock, "fence": int(fence), "iat": int(time.time())}
        if extra:
            claims.update(extra)
        return self._sign_claims(claims)

    def sign_many(self, locks: Mapping[str, int], *, extra: Mapping[str, Any] | None = None) -> str:
        """A compact JWS for a multi-lock grant: ``locks`` maps each lock name to its fence.

        Names are written sorted, so one grant has one token text. Raises ValueError for an empty
        mapping or more than ``MAX_LOCKS`` entries (the verifier would refuse such a token).
        """
        if not locks or len(locks) > MAX_LOCKS:
            raise ValueError(f"a multi-lock token fences 1 to {MAX_LOCKS} locks")
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "locks": {name: int(locks[name]) for name in sorted(locks)},
            "iat": int(time.time()),
        }
        if extra:
            claims.update(extra)
        return self._sign_claims(claims)

    def _sign_claims(self, claims: Mapping[str, Any]) -> str:
        """Signed with libsodium (``crypto_sign`` of the key's seed: the same deterministic
        Ed25519 signature as OpenSSL's, in about 60% of its time)."""
        _, _, header, secret = self._signer()
        signing_input = f"{header}.{_b64url(_COMPACT(claims).encode())}"
        signature = crypto_sign(signing_input.encode(), secret)[:64]
        return f"{signing_input}.{_b64url(signature)}"

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        """The JWKS document served at ``GET /v1/keys`` (every published key)."""
        return self._jwks

    def verifier(self) -> Verifier:
        return Verifier(self.jwks())


def read_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """``keys.json``'s ``keys`` object ({} without the file). ``ValueError`` if malformed."""
    path = directory / KEYS_MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, dict) or not all(isinstance(v, dict) for v in keys.values()):
        raise ValueError(f"{path} is not a key manifest ({{\"keys\": {{kid: {{...}}}}}})")
    return keys


def read_key_dir(directory: str | os.PathLike[str]) -> list[tuple[float, Ed25519PrivateKey]]:
    """(signs_from, key) of every ``*.pem`` private key in ``directory``, in ``signs_from``
    order: the manifest's value for the key's ``kid``, else the file's modification time.
    Raises ``OSError`` for an unreadable file, ``ValueError`` for one that is not an Ed25519
    private key or a malformed manifest."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    schedule: list[tuple[float, Ed25519PrivateKey]] = []
    for path in sorted(directory.glob("*.pem")):
        try:
            data, mtime = path.read_bytes(), path.stat().st_mtime
        except FileNotFoundError:  # retired between the listing and the read
            continue
        key = serialization.load_pem_private_key(data, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} is not an Ed25519 private key")
        entry = manifest.get(thumbprint(key.public_key()), {})
        signs_from = entry.get("signs_from")
        schedule.append((float(signs_from) if _is_number(signs_from) else mtime, key))
    schedule.sort(key=lambda item: item[0])
    return schedule


def write_private_key(directory: Path, key: Ed25519PrivateKey) -> Path:
    """Write ``key`` as ``<kid>.pem`` (PKCS#8, mode 0600) atomically: temp file, fsync, rename."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    final = directory / f"{thumbprint(key.public_key())}.pem"
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Verifier:
    """Verifies tokens offline against a JWKS (``{"keys": [...]}``).

    Only Ed25519 OKP keys with ``alg`` EdDSA (or no ``alg``) are accepted; any other key in the set
    is ignored. ``verify`` raises ``UnknownKey`` for a ``kid`` not in the set (the proxy refetches
    lockd's JWKS once on that) and ``InvalidToken`` for everything else that is wrong.

    Signatures are checked with libsodium (PyNaCl): ~60 µs a verification against ~115 µs with
    OpenSSL through ``cryptography`` on the project's machine (``python -m bench.ed25519_cost``),
    and a proxy verifies every new lease's token. libsodium is the stricter of the two (it
    refuses small-order public keys and non-canonical encodings, which no ``KeyRing`` makes);
    the tests check both agree on lockd's tokens and on tampered ones.
    """

    def __init__(self, jwks: Mapping[str, Any]):
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._verify_keys: dict[str, VerifyKey] = {}
        for jwk in jwks.get("keys", []) if isinstance(jwks, Mapping) else []:
            if not isinstance(jwk, Mapping):
                continue
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                continue
            if jwk.get("alg", ALGORITHM) != ALGORITHM:
                continue
            try:
                raw = _b64url_decode(str(jwk["x"]))
                key = Ed25519PublicKey.from_public_bytes(raw)
                verify_key = VerifyKey(raw)
            except (KeyError, ValueError):
                continue
            kid = str(jwk.get("kid") or thumbprint(key))
            self._keys[kid] = key
            self._verify_keys[kid] = verify_key

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def verify(self, token: str) -> Claims:
        """Check the signature and claims of ``token``; return its ``Claims``.

        Raises ``UnknownKey`` or ``InvalidToken`` (never anything else) with a message fit for a
        problem detail.
        """
        if not isinstance(token, str) or token.count(".") != 2 or len(token) > MAX_TOKEN_CHARS:
            raise InvalidToken("token is not a compact JWS")
        header_b64, payload_b64, signature_b64 = token.split(".")
        try:
            header = _json_object(_b64url_strict(header_b64), "header")
        except InvalidToken:
            raise InvalidToken("token header is malformed") from None
        if header.get("alg") != ALGORITHM:
            raise InvalidToken(f"token algorithm must be {ALGORITHM}")
        kid = header.get("kid")
        if not isinstance(kid, str) or kid not in self._keys:
            raise UnknownKey("token was signed by an unknown key")
        if header.get("crit") is not None:  # RFC 7515 §4.1.11: we understand no extension
            raise InvalidToken("token signature or claims are invalid")
        try:
            signature = _b64url_strict(signature_b64)
            self._verify_keys[kid].verify(f"{header_b64}.{payload_b64}".encode("ascii"),
                                          signature)
            claims = _json_object(_b64url_strict(payload_b64), "claims")
        except (BadSignatureError, ValueError, InvalidToken, UnicodeEncodeError):
            raise InvalidToken("token signature or claims are invalid") from None
        if "locks" in claims:
            return _multi_claims(claims, kid)
        lock, fence = claims.get("lock"), claims.get("fence")
        if not isinstance(lock, str) or not lock:
            raise InvalidToken("token claim 'lock' must be a non-empty string")
        mode = claims.get("mode", "exclusive")
        if mode not in ("exclusive", "shared"):
            raise InvalidToken("token claim 'mode' must be 'exclusive' or 'shared'")
        if not _is_fence(fence, shared=mode == "shared"):
            raise InvalidToken("token claim 'fence' must be a positive integer")
        shared = frozenset((lock,)) if mode == "shared" else frozenset()
        return Claims(lock=lock, fence=fence, kid=kid, locks={lock: fence}, shared=shared)


def _is_fence(value: Any, *, shared: bool = False) -> bool:
    """A fence claim: a positive integer (a shared lease's epoch may be 0: never written)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= (0 if shared else 1)


def _multi_claims(claims: Mapping[str, Any], kid: str) -> Claims:
    """The claims of a multi-lock token: ``locks`` is an object of 1..MAX_LOCKS name -> fence."""
    if "lock" in claims or "fence" in claims:
        raise InvalidToken("token carries both 'lock' and 'locks'")
    locks = claims["locks"]
    if not isinstance(locks, dict) or not 1 <= len(locks) <= MAX_LOCKS:
        raise InvalidToken(f"token claim 'locks' must map 1 to {MAX_LOCKS} lock names to fences")
    shared = claims.get("shared", [])
    if not isinstance(shared, list) or not all(
            isinstance(name, str) and name in locks for name in shared):
        raise InvalidToken("token claim 'shared' must list locks of the token")
    for name, fence in locks.items():
        if not name:
            raise InvalidToken("token claim 'locks' holds an empty lock name")
        if not _is_fence(fence, shared=name in shared):
            raise InvalidToken("token claim 'locks' holds a fence that is not a positive integer")
    return Claims(lock=None, fence=None, kid=kid, locks=dict(locks), multi=True,
                  shared=frozenset(shared))
