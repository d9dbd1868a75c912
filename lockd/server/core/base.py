"""``Core``: what every primitive's service stands on, made once per lockd process: the store,
the one token signer, the wait queues and the request bounds; and the lease ids they draw."""

from __future__ import annotations

import secrets

from lockd.server.core.signer import Signer
from lockd.server.core.waiting import WaitQueues
from lockd.server.errors import InvalidRequest
from lockd.server.settings import Settings
from lockd.server.store.base import Store
from lockd.tokens import KeyRing

__all__ = ["Core", "new_lease_id"]


def new_lease_id() -> str:
    """An unguessable lease id: 192 random bits, URL-safe base64 (32 characters), never
    beginning with ``-``: lease ids are passed as command-line arguments (``lockctl renew NAME
    LEASE_ID``), where a leading dash reads as an option. Redrawing costs one id in 64 and
    leaves over 191 bits of entropy."""
    while (lease_id := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return lease_id


class Core:
    """The shared parts of every primitive (``store``, ``signer``, ``waiting``, ``settings``).

    It takes no clock: expiry is the store's business, and ``wait_ms`` deadlines run on the
    event loop's monotonic timer. ``ordered``: the store applies operations in call order
    (``StoreCore``)."""

    def __init__(self, store: Store, keyring: KeyRing, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.signer = Signer(keyring)
        self.waiting = WaitQueues(store)
        self.ordered = bool(getattr(store, "ordered", False))

    def check_ttl(self, ttl_ms: int) -> None:
        """``InvalidRequest`` unless ``min_ttl_ms <= ttl_ms <= max_ttl_ms``."""
        low, high = self.settings.min_ttl_ms, self.settings.max_ttl_ms
        if not low <= ttl_ms <= high:
            raise InvalidRequest(f"ttl_ms must be between {low} and {high} (got {ttl_ms})")

    def check_wait(self, wait_ms: int) -> None:
        """``InvalidRequest`` unless ``0 <= wait_ms <= max_wait_ms``."""
        high = self.settings.max_wait_ms
        if not 0 <= wait_ms <= high:
            raise InvalidRequest(f"wait_ms must be between 0 and {high} (got {wait_ms})")

    def shutdown(self) -> None:
        """Answer every queued request with 503 now (a lockd stopping must not keep clients
        waiting minutes); later ones only try once."""
        self.waiting.shutdown()
