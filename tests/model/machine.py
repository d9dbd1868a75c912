"""The state machine: random sequences of calls of every primitive on the few overlapping names
of ``tests.model.names``, each answer checked by ``tests.model.model`` as it comes.

Rules: exclusive and shared acquires, multi-lock acquires (some locks shared), permits,
campaigns, client_id retries (a lease's client_id sent again, on its own route or another
primitive's, for its own names or another's), renewals, releases, expiries, force-releases,
writes of every row with every token through the proxy and through ``fenced_transaction``, and
reads of lockd's view of a lock, an election or a semaphore. Every call is a single try
(``wait_ms`` 0); leases last an hour unless a rule lets one expire, so a lease the model
believes live is live.

A new grant is claimed at the proxy at once (a shared one claims for reading), as the client
library does on first use: then a write commits only with the lock's latest exclusive fence,
and the write rule's promise is exact: a write commits only for a token that holds the row's
lock exclusively, from the lock's latest exclusive grant; a shared lease's write fails on both
paths; and the latest grant's own write through the proxy is never refused as stale.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from tests.model.model import EXCLUSIVE, SHARED, Call, Lease, Model, slot_lock
from tests.model.names import LOCKS, RESERVED, SEMAPHORES, Namespace
from tests.model.violations import (
    CurrentHolderRefused,
    Disagreement,
    FenceWentBack,
    ForeignTokenWrote,
    RetryNotIdempotent,
    SharedLeaseWrote,
    SlotNameAccepted,
    StaleTokenWrote,
    StatusDisagrees,
    TooManyPermits,
    TwoLeaders,
    report,
)
from tests.model.world import World

__all__ = ["ModelMachine"]

LONG_TTL_MS = 3_600_000

lock_names = st.sampled_from(tuple(n for n in LOCKS if not n.startswith(RESERVED)) * 3
                             + tuple(n for n in LOCKS if n.startswith(RESERVED)))
"""Every lock name; a plain one three times as often as a semaphore slot's (those are refused
on every route but a permit's)."""
semaphores = st.sampled_from(sorted(SEMAPHORES))
client_ids = st.sampled_from((True, True, False))
"""Whether an acquire sends a client_id (mostly: the retry rules resend it)."""
lock_sets = st.lists(st.tuples(lock_names, st.booleans()), min_size=1, max_size=3,
                     unique_by=lambda pair: pair[0])


class ModelMachine(RuleBasedStateMachine):
    """One run: a fresh namespace on the world's lockd and database."""

    world: ClassVar[World]
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.ns = Namespace(self.world.new_run())
        self.model = Model(self.ns)
        self._numbers = itertools.count(1)
        self.expiries = 0

    # --- acquiring ------------------------------------------------------------------------

    @rule(target=leases, name=lock_names, shared=st.booleans(), with_id=client_ids)
    def acquire(self, name: str, shared: bool, with_id: bool):
        """``POST /v1/locks/{name}/acquire``, exclusive or shared."""
        return self._lock(name, SHARED if shared else EXCLUSIVE, self._client_id(with_id))

    @rule(target=leases, locks=lock_sets, with_id=client_ids)
    def acquire_many(self, locks: list[tuple[str, bool]], with_id: bool):
        """``POST /v1/leases/acquire``: 1-3 locks, each exclusive or shared."""
        modes = {lock: SHARED if shared else EXCLUSIVE for lock, shared in locks}
        return self._many(modes, self._client_id(with_id))

    @rule(target=leases, semaphore=semaphores, with_id=client_ids)
    def acquire_permit(self, semaphore: str, with_id: bool):
        """``POST /v1/semaphores/{name}/acquire`` with the semaphore's limit."""
        return self._permit(semaphore, self._client_id(with_id))

    @rule(target=leases, name=lock_names, with_id=client_ids)
    def campaign(self, name: str, with_id: bool):
        """``POST /v1/elections/{name}/campaign``."""
        return self._campaign(name, self._client_id(with_id))

    # A client_id retry: the lease's client_id sent again, on the lease's own route or another
    # primitive's, for the lease's own lock (``name`` None; the first in name order) or for
    # ``name``.

    @rule(target=leases, lease=leases, shared=st.booleans(), name=st.none() | lock_names)
    def retry_acquire(self, lease: Lease, shared: bool, name: str | None):
        """A lock acquire, exclusive or shared."""
        return self._lock(name or self._first(lease), SHARED if shared else EXCLUSIVE,
                          lease.client_id)

    @rule(target=leases, lease=leases)
    def retry_campaign(self, lease: Lease):
        """A campaign for the lease's own lock."""
        return self._campaign(self._first(lease), lease.client_id)

    @rule(target=leases, lease=leases, permit=st.booleans(), name=st.none() | lock_names)
    def retry_many_or_permit(self, lease: Lease, permit: bool, name: str | None):
        """A multi-lock acquire of the lease's locks in their modes (or of ``name``), or a permit
        of the lease's semaphore (another lease: of ``enc``)."""
        if permit:
            return self._permit(lease.name if lease.kind == "permit" else "enc", lease.client_id)
        return self._many(dict(lease.modes) if name is None else {name: EXCLUSIVE},
                          lease.client_id)

    @staticmethod
    def _first(lease: Lease) -> str:
        return min(lease.fences)

    def _lock(self, name: str, mode: str, client_id: str | None):
        call = self.model.predict("lock", (name,), {name: mode}, client_id, self._owner())
        body = {"ttl_ms": LONG_TTL_MS, "owner": call.owner, "mode": mode}
        return self._acquired(call, f"/v1/locks/{self.ns.lock(name)}/acquire", body)

    def _many(self, modes: dict[str, str], client_id: str | None):
        locks = tuple(sorted(modes))
        call = self.model.predict("multi", locks, modes, client_id, self._owner())
        body = {"ttl_ms": LONG_TTL_MS, "owner": call.owner,
                "locks": [self.ns.lock(lock) for lock in locks],
                "modes": {self.ns.lock(lock): mode for lock, mode in modes.items()}}
        return self._acquired(call, "/v1/leases/acquire", body)

    def _permit(self, semaphore: str, client_id: str | None):
        call = self.model.predict("permit", (), {}, client_id, self._owner(), semaphore)
        body = {"ttl_ms": LONG_TTL_MS, "owner": call.owner, "limit": SEMAPHORES[semaphore]}
        path = f"/v1/semaphores/{self.ns.semaphore(semaphore)}/acquire"
        return self._acquired(call, path, body)

    def _campaign(self, name: str, client_id: str | None):
        call = self.model.predict("leader", (name,), {name: EXCLUSIVE}, client_id, self._owner())
        body = {"ttl_ms": LONG_TTL_MS, "owner": call.owner, "value": call.owner}
        return self._acquired(call, f"/v1/elections/{self.ns.lock(name)}/campaign", body)

    def _acquired(self, call: Call, path: str, body: dict):
        """Send the acquire; check the answer against the prediction and the rules; claim a
        new lease's locks at the proxy. Returns the new lease for the bundle, or nothing."""
        if call.client_id is not None:
            body["client_id"] = call.client_id
        response = self.world.post(path, body)
        status = response.status_code
        if status == 200:
            doc = response.json()
            lease, new = self.model.receive(next(self._numbers), call, doc,
                                            self.world.claims(doc["token"]),
                                            self.world.refusal(doc["token"]))
            if not new:
                return multiple()
            self._claim_at_grant(lease)
            return lease
        if call.reserved:
            if status != 422:
                report(SlotNameAccepted, f"{call}: a semaphore slot's name answered {status} "
                       f"{response.text}, not 422")
            return multiple()
        if call.retry is not None:
            report(RetryNotIdempotent, f"{call}: a client_id retry of live {call.retry!r} "
                   f"answered {status} {response.text}")
            return multiple()
        if status == 409 and not call.unsure and self.model.grantable(call):
            raise Disagreement(f"{call}: refused ({response.text}) though the model has it "
                               f"free: {self._holders_of(call)}")
        if status not in (409, 422) or (status == 422 and not call.unsure):
            raise Disagreement(f"{call}: answered {status} {response.text}")
        return multiple()

    def _claim_at_grant(self, lease: Lease) -> None:
        """Claim every lock of a new lease at the proxy (claim-for-read for a shared one): the
        lock's latest grant is never stale there."""
        for lock in sorted(lease.fences):
            response = self.world.claim(self.ns.lock(lock), lease.token)
            if response.status_code != 200:
                report(CurrentHolderRefused,
                       f"the claim of new {lease!r} on {lock} answered {response.status_code} "
                       f"{response.text}")

    # --- renewing, releasing, ending ------------------------------------------------------

    @rule(lease=leases)
    def renew(self, lease: Lease) -> None:
        """Renew on the lease's own route: 200 with the same fences and modes while it holds
        every lock, 410 after."""
        self._renew(lease, None)

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        """Release (resign) on the lease's own route: 200 while it holds every lock, else 410
        (a multi-lock lease then frees whatever it still held)."""
        response = self.world.post(self._path(lease, "release"), {"lease_id": lease.lease_id})
        expected = 200 if lease.renewable else 410
        if response.status_code != expected:
            raise Disagreement(f"release of {lease!r} answered {response.status_code} "
                               f"{response.text}, expected {expected}")
        self.model.end(lease, unclean=False if expected == 200 else None)

    @precondition(lambda self: self.world.expiries is None
                  or self.expiries < self.world.expiries)
    @rule(lease=leases)
    def expire(self, lease: Lease) -> None:
        """Renew the lease with the shortest TTL and let it run out (lockd's clock moved on
        SQLite, real time elsewhere), until lockd shows it gone."""
        if not lease.renewable:
            return
        self.expiries += 1
        self._renew(lease, self.world.short_ttl_ms)
        self.world.pass_time(2.0)
        self.world.wait(lambda: self._gone(lease), f"{lease!r} to expire")
        self.model.end(lease, unclean=True)

    @rule(name=lock_names)
    def force_release(self, name: str) -> None:
        """Admin ``POST /v1/locks/{name}/force-release``: ends every lease of the lock (not a
        semaphore's permits, which are not leases of the lock table)."""
        held = [lease for lease, _ in self.model.holdings(name, permits=False)]
        response = self.world.post(f"/v1/locks/{self.ns.lock(name)}/force-release", admin=True)
        if response.status_code == 422 and name.startswith(RESERVED) and not held:
            return  # a slot's name refused on this route too
        if response.status_code != 200:
            raise Disagreement(f"force-release of {name} answered {response.status_code} "
                               f"{response.text}")
        doc = response.json()
        owners = {lease.owner for lease in held}
        if doc["released"] != bool(held) or (held and doc["owner"] not in owners):
            report(StatusDisagrees, f"force-release of {name} answered {doc}; live: {held}")
        for lease in held:
            self.model.end(lease, [name], unclean=True)

    def _renew(self, lease: Lease, ttl_ms: int | None) -> None:
        body = {"lease_id": lease.lease_id}
        if ttl_ms is not None:
            body["ttl_ms"] = ttl_ms
        response = self.world.post(self._path(lease, "renew"), body)
        expected = 200 if lease.renewable else 410
        if response.status_code != expected:
            raise Disagreement(f"renew of {lease!r} answered {response.status_code} "
                               f"{response.text}, expected {expected}")
        if expected == 200:
            self._same_lease(lease, response.json())

    def _same_lease(self, lease: Lease, doc: dict) -> None:
        """A renewal answers the lease as granted: same id, fences, modes (its token's too)."""
        call = Call(lease.kind, tuple(sorted(lease.fences)) if lease.kind != "permit" else (),
                    dict(lease.modes), lease.client_id, lease.owner, lease.name
                    if lease.kind == "permit" else None, retry=lease)
        again, new = self.model.receive(0, call, doc, self.world.claims(doc["token"]),
                                        self.world.refusal(doc["token"]))
        if new or again is not lease:
            raise Disagreement(f"renew of {lease!r} answered another lease: {doc}")

    def _path(self, lease: Lease, verb: str) -> str:
        if lease.kind == "multi":
            return f"/v1/leases/{verb}"
        if lease.kind == "permit":
            return f"/v1/semaphores/{self.ns.semaphore(lease.name)}/{verb}"
        if lease.kind == "leader":
            verb = "resign" if verb == "release" else verb
            return f"/v1/elections/{self.ns.lock(lease.name)}/{verb}"
        return f"/v1/locks/{self.ns.lock(lease.name)}/{verb}"

    def _gone(self, lease: Lease) -> bool:
        if lease.kind == "permit":
            doc = self.world.get(f"/v1/semaphores/{self.ns.semaphore(lease.name)}")
            return all(p["owner"] != lease.owner for p in doc["permits"])
        return all(all(h["owner"] != lease.owner for h in self._lock_state(lock)["holders"] or [])
                   for lock in lease.held)

    # --- writing --------------------------------------------------------------------------

    @rule(lease=leases, row=st.none() | lock_names, which=st.integers(0, 2))
    def write_proxy(self, lease: Lease, row: str | None, which: int) -> None:
        """``PUT`` the row of one of the lease's locks (``row`` None; ``which`` picks it) or of
        lock ``row`` through the proxy with the lease's token."""
        self._write(lease, row, which, "proxy")

    @rule(lease=leases, row=st.none() | lock_names, which=st.integers(0, 2))
    def write_sql(self, lease: Lease, row: str | None, which: int) -> None:
        """The same row upserted in ``fenced_transaction`` with the lease's token."""
        self._write(lease, row, which, "sql")

    def _write(self, lease: Lease, row: str | None, which: int, path: str) -> None:
        own = sorted(lease.fences)
        lock = row or own[which % len(own)]
        table, columns, key = self.ns.row(lock)
        claims = self.world.claims(lease.token)
        physical = self.ns.lock(lock)
        fence = claims.fence_for(physical)
        value = next(self._numbers)
        if path == "proxy":
            response = self.world.proxy_write(table, key, value, lease.token)
            refusal = None if response.status_code < 300 else (
                f"{response.status_code} {response.json().get('code')}")
        else:
            refusal = self.world.sql_write(table, columns, key, value, lease.token)
        book = self.model.books[lock]
        what = f"{path} write of {lock}'s row with {lease!r}"
        if refusal is None:
            if fence is None:
                report(ForeignTokenWrote, f"{what} committed: the token does not hold {lock}")
            elif lease.modes.get(lock) != EXCLUSIVE or claims.mode_for(physical) != EXCLUSIVE:
                report(SharedLeaseWrote, f"{what} committed: the lease holds {lock} shared "
                       f"(token fence {fence})")
            elif fence != book.exclusive:
                report(StaleTokenWrote, f"{what} committed at fence {fence}: the latest exclusive "
                       f"grant of {lock} is {book.exclusive}")
        elif (path == "proxy" and fence is not None and lease.modes.get(lock) == EXCLUSIVE
              and fence == book.exclusive == book.issued and "stale" in refusal):
            report(CurrentHolderRefused, f"{what} refused ({refusal}) though fence {fence} is the "
                   f"latest grant of {lock}")

    # --- reading lockd's view -------------------------------------------------------------

    @rule(name=lock_names)
    def observe(self, name: str) -> None:
        """``GET /v1/locks/{name}`` and ``GET /v1/elections/{name}`` show the leases granted (a
        semaphore slot's name may be refused there: 422)."""
        held = self.model.holdings(name, permits=False)
        refusable = name.startswith(RESERVED) and not held
        state = self.world.get(f"/v1/locks/{self.ns.lock(name)}", refusable=refusable)
        if state is not None:
            seen = sorted((h["owner"], h["mode"]) for h in state["holders"] or [])
            if seen != sorted((lease.owner, mode) for lease, mode in held):
                report(StatusDisagrees, f"GET {name}: holders {seen}; granted and live: {held}")
            book = self.model.books[name]
            if state["fence"] < book.reported:
                report(FenceWentBack, f"GET {name}: fence {state['fence']}, earlier "
                       f"{book.reported}")
            book.reported = state["fence"]
        election = self.world.get(f"/v1/elections/{self.ns.lock(name)}", refusable=refusable)
        if election is None:
            return
        leaders = [lease.owner for lease, mode in held if mode == EXCLUSIVE]
        shown = election["leader"]["owner"] if election["leader"] else None
        if [shown] != (leaders or [None]):
            report(TwoLeaders, f"GET election {name}: leader {shown!r}; the lock's exclusive "
                   f"holders: {leaders}")

    @rule(semaphore=semaphores)
    def observe_semaphore(self, semaphore: str) -> None:
        """``GET /v1/semaphores/{name}`` shows the permits granted, at most ``limit``."""
        doc = self.world.get(f"/v1/semaphores/{self.ns.semaphore(semaphore)}")
        seen = sorted((p["owner"], p["slot"], p["fence"]) for p in doc["permits"])
        if len(seen) > SEMAPHORES[semaphore]:
            report(TooManyPermits, f"GET semaphore {semaphore}: permits {seen}")
        want = sorted((p.owner, p.slot, p.fences[slot_lock(semaphore, p.slot)])
                      for p in self.model.permits(semaphore))
        if seen != want:
            report(StatusDisagrees, f"GET semaphore {semaphore}: permits {seen}; granted: {want}")

    @invariant()
    def check_holders(self) -> None:
        """After every step: see ``Model.check_holders``."""
        self.model.check_holders()

    def teardown(self) -> None:
        """Release what the run still holds (the next run uses other names anyway)."""
        for lease in self.model.leases:
            if lease.held:
                self.world.post(self._path(lease, "release"), {"lease_id": lease.lease_id})

    # --- helpers --------------------------------------------------------------------------

    def _lock_state(self, name: str) -> dict:
        return self.world.get(f"/v1/locks/{self.ns.lock(name)}")

    def _holders_of(self, call: Call) -> list:
        if call.kind == "permit":
            return self.model.permits(call.semaphore)
        return [self.model.holdings(lock) for lock in call.locks]

    def _owner(self) -> str:
        return f"o{next(self._numbers)}"

    def _client_id(self, wanted: bool) -> str | None:
        return f"model-{self.ns.run}-client-{next(self._numbers):06d}" if wanted else None
