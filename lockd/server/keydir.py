"""Key rotation as an operation on the key directory: list, rotate, retire (``lockd keys ...``).

The key directory (``--key-dir``, ``lockd.tokens``) is the one key set of every replica that
shares it; each running lockd re-reads it every ``key_reload_ms`` (``watch``), so rotation needs
no restart. ``rotate`` records the new key with a ``signs_from`` in the future and only then
writes its file: every replica publishes it before any signs with it. ``retire`` deletes a key's
file once ``max_ttl_ms`` has passed since it stopped signing (a lease lives at most that long
past its last renewal, and renewals after the switch are signed by the new key), or at once with
``force``. Both read, change and write the manifest while holding the directory's lock file
(``.keys.lock``, ``flock``), so two operators (or scripts) rotating at once cannot both add a
key: the second waits for the first and is then refused, as a rotation while one is pending is.
The steps, and why this time rule rather than asking lockd: docs/keys.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lockd.tokens import (
    KEYS_MANIFEST,
    KeyRing,
    read_key_dir,
    read_manifest,
    thumbprint,
    write_private_key,
)

__all__ = ["LOCK_FILE", "KeyDirError", "KeyState", "list_keys", "locked", "retire", "rotate",
           "watch"]

log = logging.getLogger("lockd.keys")

LOCK_FILE = ".keys.lock"
"""The key directory's lock file: held (``flock``, exclusive) by every rotate and retire."""
LOCK_WAIT_S = 30.0
"""How long a key operation waits for another one's lock before giving up."""


class KeyDirError(Exception):
    """A key operation refused (the message says why, in one line)."""


@dataclass(frozen=True)
class KeyState:
    """One key of the directory. Times are unix seconds.

    ``state``: ``pending`` (published, signs from ``signs_from``), ``signing``, ``published``
    (signed until ``stopped_at``; verifies old tokens) or ``retired`` (its file deleted at
    ``retired_at``; in the manifest only)."""

    kid: str
    state: str
    signs_from: float | None
    stopped_at: float | None = None
    retired_at: float | None = None


def list_keys(key_dir: str | os.PathLike[str], *, now: float | None = None) -> list[KeyState]:
    """Every key of ``key_dir``: those with a file in ``signs_from`` order, then the retired."""
    directory = Path(key_dir)
    now = time.time() if now is None else now
    schedule = read_key_dir(directory)
    manifest = read_manifest(directory)
    signer = _signer_index(schedule, now)
    states = []
    for index, (signs_from, key) in enumerate(schedule):
        later = schedule[index + 1][0] if index + 1 < len(schedule) else None
        if index == signer:
            state, stopped = "signing", None
        elif signs_from > now and index > signer:
            state, stopped = "pending", None
        else:
            state, stopped = "published", later
        states.append(KeyState(thumbprint(key.public_key()), state, signs_from, stopped))
    present = {s.kid for s in states}
    for kid, entry in sorted(manifest.items()):
        if kid not in present and entry.get("retired_at") is not None:
            states.append(KeyState(kid, "retired", entry.get("signs_from"),
                                   retired_at=entry["retired_at"]))
    return states


def _signer_index(schedule: list[tuple[float, Ed25519PrivateKey]], now: float) -> int:
    """The index of the key that signs at ``now`` (as ``KeyRing`` picks it)."""
    index = 0
    for i, (signs_from, _) in enumerate(schedule):
        if signs_from <= now:
            index = i
    return index


def rotate(key_dir: str | os.PathLike[str], *, publish_delay_s: float,
           now: float | None = None) -> KeyState:
    """Make a new key that is published at once and signs ``publish_delay_s`` from now.

    ``publish_delay_s`` must exceed every replica's ``key_reload_ms`` plus the proxies'
    ``jwks_refetch_interval_ms`` (plus clock skew): each replica publishes the key before any
    signs with it, and a proxy whose last load just missed it may refetch on the new ``kid``
    by then. Raises ``KeyDirError`` while another rotation is still pending (two pending keys
    would leave the order to chance; so is the second of two concurrent rotations, once the first
    is done) or when another key operation holds the directory for ``LOCK_WAIT_S``;
    ``OSError``/``ValueError`` for an unreadable directory."""
    directory = Path(key_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with locked(directory):
        return _rotate(directory, publish_delay_s, time.time() if now is None else now)


def _rotate(directory: Path, publish_delay_s: float, now: float) -> KeyState:
    pending = [s for s in list_keys(directory, now=now) if s.state == "pending"]
    if pending:
        raise KeyDirError(f"key {pending[0].kid} is already pending (it signs from "
                          f"{_when(pending[0].signs_from)}): wait until it signs")
    key = Ed25519PrivateKey.generate()
    kid = thumbprint(key.public_key())
    signs_from = now + publish_delay_s
    manifest = read_manifest(directory)
    for old_kid, old_signs_from in _current_kids(directory):
        manifest.setdefault(old_kid, {}).setdefault("signs_from", old_signs_from)
    manifest[kid] = {"created_at": now, "signs_from": signs_from, "retired_at": None}
    _write_manifest(directory, manifest)  # first: the file never appears without its time
    write_private_key(directory, key)
    return KeyState(kid, "pending", signs_from)


def _current_kids(directory: Path) -> list[tuple[str, float]]:
    """(kid, signs_from) of the keys with a file, so the manifest pins the times a file's
    modification time gave them (a copied directory must not reorder them)."""
    return [(thumbprint(key.public_key()), at) for at, key in read_key_dir(directory)]


def retire(key_dir: str | os.PathLike[str], kid: str, *, max_ttl_ms: int, force: bool = False,
           now: float | None = None) -> str:
    """Delete key ``kid``'s file and record when; returns a line saying what was done.

    Refused (``KeyDirError``) for an unknown ``kid``, for the key that signs now or is about to
    (rotate first), and, unless ``force``, until ``max_ttl_ms`` has passed since the key stopped
    signing: a live lease may hold only a token of that key until then (module docstring). With
    ``force`` inside that window the line says that tokens of leases granted or renewed in the
    last so many seconds may become unverifiable."""
    directory = Path(key_dir)
    if not directory.is_dir():  # no key to retire, and no lock file to take
        return _retire(directory, kid, max_ttl_ms, force, time.time() if now is None else now)
    with locked(directory):
        return _retire(directory, kid, max_ttl_ms, force, time.time() if now is None else now)


def _retire(directory: Path, kid: str, max_ttl_ms: int, force: bool, now: float) -> str:
    states = {s.kid: s for s in list_keys(directory, now=now)}
    state = states.get(kid)
    if state is None or state.state == "retired":
        known = ", ".join(k for k, s in states.items() if s.state != "retired") or "none"
        raise KeyDirError(f"no key {kid!r} in {directory} (keys: {known})")
    if state.state in ("signing", "pending"):
        raise KeyDirError(f"key {kid} {'signs now' if state.state == 'signing' else 'is pending'}"
                          ": rotate to a new key first, then retire this one once it stopped "
                          "signing")
    assert state.stopped_at is not None
    safe_at = state.stopped_at + max_ttl_ms / 1000
    note = f"retired {kid}"
    if now < safe_at:
        if not force:
            raise KeyDirError(
                f"key {kid} stopped signing {_ago(now - state.stopped_at)} ago; a lease may still hold a "
                f"token it signed until max TTL ({max_ttl_ms} ms) has passed since, at "
                f"{_when(safe_at)}: retire then, or now with --force")
        at_risk = min(safe_at - now, max_ttl_ms / 1000)
        note += (f" (forced: tokens it signed in its last {at_risk:.0f} s of signing may "
                 f"still be held by live leases; those become unverifiable)")
    manifest = read_manifest(directory)
    manifest.setdefault(kid, {}).update(retired_at=now)
    manifest[kid].setdefault("signs_from", state.signs_from)
    _write_manifest(directory, manifest)
    (directory / f"{kid}.pem").unlink(missing_ok=True)
    return note


@contextlib.contextmanager
def locked(directory: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``directory``'s lock file (``LOCK_FILE``) for a read-change-write of its keys;
    waits up to ``wait_s`` for another holder (``KeyDirError`` after that). The kernel drops
    the lock when its process dies, so a crashed operation never blocks the next."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise KeyDirError(f"another key operation has held {directory / LOCK_FILE} "
                                      f"for {wait_s:.0f} s: retry when it is done") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    path = directory / KEYS_MANIFEST
    tmp = directory / f".{KEYS_MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"keys": manifest}, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s"


async def watch(ring: KeyRing, interval_s: float,
                on_change: Callable[[KeyRing], None] | None = None) -> None:
    """Re-read ``ring``'s key directory every ``interval_s`` until cancelled; call
    ``on_change(ring)`` when the published keys or the signer changed. A failed read is one
    warning and keeps the keys loaded (a transient problem of a shared volume must not stop
    signing)."""
    while True:
        await asyncio.sleep(interval_s)
        if ring.directory is None:
            return
        try:  # files are read in a thread, the ring replaced on the loop (where it signs)
            changed = ring.replace(await asyncio.to_thread(read_key_dir, ring.directory))
        except (OSError, ValueError) as exc:
            log.warning("could not re-read the key directory %s: %s (keeping the keys loaded)",
                        ring.directory, exc)
            continue
        if changed:
            log.info("keys reloaded from %s: %d published, signing with %s",
                     ring.directory, len(ring.kids), ring.kid)
            if on_change is not None:
                on_change(ring)
