"""The model: every lease lockd granted in one run, which locks each still holds and in which
mode, and per lock the fences seen; the rules every answer must keep.

The model learns only from answers (and from the ends it causes itself: releases, expiries it
waited for, force-releases), so what it believes live IS live. ``receive`` takes a granted
lease, checks it against everything granted before and records it; ``check_holders`` is the
state invariant run after every step.

Fences of shared grants: a shared grant carries the lock's current fence (its write epoch),
except the first grant after an exclusive lease that ended WITHOUT a clean release (it expired,
or an operator force-released it): that one must start a new epoch, one raise above every fence
issued before; readers granted after it share that epoch. The model knows how an exclusive lease
ended (it expires leases only on purpose, waiting until lockd shows them gone) and expects the
raise there; only where it cannot tell (a release answered 410 that still freed locks) does it
accept either the current fence or a raise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lockd.tokens import Claims
from tests.model.names import LOCKS, RESERVED, SEMAPHORES, Namespace
from tests.model.violations import (
    Disagreement,
    GrantDidNotRaise,
    InvalidTokenIssued,
    RetryNotIdempotent,
    SharedEpochWrong,
    SlotNameAccepted,
    TokenForAnotherLock,
    TokenModeNotLeaseMode,
    TooManyPermits,
    TwoHolders,
    TwoLeaders,
    report,
)

__all__ = ["EXCLUSIVE", "SHARED", "Call", "Lease", "LockBook", "Model", "slot_lock"]

EXCLUSIVE, SHARED = "exclusive", "shared"
KINDS = ("lock", "multi", "permit", "leader")


def slot_lock(semaphore: str, slot: int) -> str:
    """The logical lock of a permit's slot."""
    return f"{RESERVED}{semaphore}/{slot}"


@dataclass(eq=False)
class Lease:
    """A lease as granted: ``fences``/``modes`` per logical lock; ``held``: the locks it still
    holds (a force-release takes one lock off a multi-lock lease); ``renewable``: renew and
    release answer 200 (every lock still held)."""

    n: int
    kind: str
    name: str  # the lock or election; the semaphore of a permit; "" for a multi-lock lease
    lease_id: str
    owner: str
    client_id: str | None
    fences: dict[str, int]
    modes: dict[str, str]
    token: str
    slot: int | None = None
    held: set[str] = field(default_factory=set)
    renewable: bool = True

    def __repr__(self) -> str:
        locks = ", ".join(f"{lock} {self.modes[lock]} @{self.fences[lock]}"
                          for lock in sorted(self.fences))
        return f"<lease #{self.n} {self.kind} {self.name or ''} [{locks}] owner={self.owner}>"


@dataclass
class LockBook:
    """What the model saw of one lock: the highest fence any grant carried (``issued``), the
    latest exclusive grant's fence (``exclusive``; a permit is its slot's exclusive grant),
    whether the last exclusive lease ended uncleanly with no grant since (``unclean``: None when
    the model cannot tell, see ``Model.end``), and the
    highest fence ``GET`` reported (``reported``)."""

    issued: int = 0
    exclusive: int = 0
    unclean: bool | None = False
    reported: int = 0


@dataclass(frozen=True)
class Call:
    """One acquire as sent: the route's kind, the logical locks asked for and their modes (a
    permit: its semaphore), the client_id, and the model's prediction.

    ``retry``: the live lease a client_id retry must answer with (same route, same locks, same
    modes). ``unsure``: a live lease of this client_id overlaps the call in another way (another
    route or mode): lockd may answer it, refuse, or grant anew, and the answer is only checked
    against the rules.
    """

    kind: str
    locks: tuple[str, ...]
    modes: dict[str, str]
    client_id: str | None
    owner: str
    semaphore: str | None = None
    retry: Lease | None = None
    unsure: bool = False

    @property
    def reserved(self) -> bool:
        return self.kind != "permit" and any(lock.startswith(RESERVED) for lock in self.locks)

    def __repr__(self) -> str:
        what = self.semaphore if self.kind == "permit" else ", ".join(
            f"{lock} {self.modes[lock]}" for lock in self.locks)
        return f"{self.kind} [{what}] client_id={self.client_id}"


class Model:
    """The leases of one run and the books of its locks and semaphores."""

    def __init__(self, ns: Namespace):
        self.ns = ns
        self.leases: list[Lease] = []
        self.by_id: dict[str, Lease] = {}
        self.books = {lock: LockBook() for lock in LOCKS}
        self.sem_fence = dict.fromkeys(SEMAPHORES, 0)

    # --- what is live ---------------------------------------------------------------------

    def holdings(self, lock: str, *, permits: bool = True) -> list[tuple[Lease, str]]:
        return [(lease, lease.modes[lock]) for lease in self.leases if lock in lease.held
                and (permits or lease.kind != "permit")]

    def free_for(self, lock: str, mode: str) -> bool:
        held = self.holdings(lock)
        return not held if mode == EXCLUSIVE else all(m == SHARED for _, m in held)

    def permits(self, semaphore: str) -> list[Lease]:
        return [lease for lease in self.leases
                if lease.kind == "permit" and lease.name == semaphore and lease.held]

    def predict(self, kind: str, locks: tuple[str, ...], modes: dict[str, str],
                client_id: str | None, owner: str, semaphore: str | None = None) -> Call:
        """The call with the model's prediction of how lockd must answer it."""
        retry, unsure = None, False
        if client_id is not None:
            mine = [lease for lease in self.leases if lease.client_id == client_id and lease.held]
            for lease in mine:
                if kind == "permit":
                    same = lease.kind == "permit" and lease.name == semaphore
                    overlaps = same
                else:
                    same = (lease.kind == kind and set(lease.fences) == set(locks)
                            and lease.modes == modes and lease.renewable)
                    overlaps = bool(lease.held & set(locks))
                if same:
                    retry = lease
                elif overlaps:
                    unsure = True
        if unsure:  # two live leases of one client_id: which one a retry finds is not promised
            retry = None
        return Call(kind, locks, modes, client_id, owner, semaphore, retry, unsure)

    def grantable(self, call: Call) -> bool:
        if call.kind == "permit":
            return len(self.permits(call.semaphore)) < SEMAPHORES[call.semaphore]
        return all(self.free_for(lock, call.modes[lock]) for lock in call.locks)

    # --- a grant --------------------------------------------------------------------------

    def receive(self, n: int, call: Call, body: dict, claims: Claims,
                refusal: str | None = None) -> tuple[Lease, bool]:
        """Check a 200 answer to ``call`` and record it: ``(lease, True)`` for a new lease,
        ``(the earlier lease, False)`` for a retry's. ``claims``: its token's claims;
        ``refusal``: why a verifier refuses the token (None: it does not)."""
        fences, token_modes, slot = self._token_locks(call, body, claims)
        known = self.by_id.get(body["lease_id"])
        if known is not None:
            self._answered_with(known, call, fences, token_modes)
            self._verifiable(call, body, refusal)
            return known, False
        if call.retry is not None:
            report(RetryNotIdempotent, f"{call}: a client_id retry of live {call.retry!r} was "
                   f"answered with a new lease {body['lease_id']!r}")
        if call.reserved:
            report(SlotNameAccepted,
                   f"{call} was granted: lease {body['lease_id']!r}, token for "
                   f"{sorted(claims.locks.items())} (a fence of the lock table's counter for a "
                   f"semaphore slot's lock)")
        modes = ({slot_lock(call.semaphore, slot): EXCLUSIVE} if call.kind == "permit"
                 else dict(call.modes))
        for lock, mode in modes.items():
            if token_modes[lock] != mode:
                report(TokenModeNotLeaseMode,
                       f"{call}: new lease {body['lease_id']!r} holds {lock} {mode}, its token "
                       f"says {token_modes[lock]}")
            self._check_fence(call, lock, mode, fences[lock])
        self._verifiable(call, body, refusal)
        if call.kind == "permit":
            if fences[slot_lock(call.semaphore, slot)] <= self.sem_fence[call.semaphore]:
                report(GrantDidNotRaise,
                       f"{call}: permit fence {fences[slot_lock(call.semaphore, slot)]} is not above "
                       f"the semaphore's last, {self.sem_fence[call.semaphore]}")
        lease = Lease(n, call.kind, call.semaphore or (call.locks[0] if call.kind in (
            "lock", "leader") else ""), body["lease_id"], call.owner, call.client_id, fences,
            modes, body["token"], slot, set(fences))
        self._record(lease)
        return lease, True

    def _token_locks(self, call: Call, body: dict,
                     claims: Claims) -> tuple[dict[str, int], dict[str, str], int | None]:
        """The token's locks (logical name -> fence, -> mode), checked against the call and the
        body; the permit's slot."""
        fences: dict[str, int] = {}
        modes: dict[str, str] = {}
        for physical, fence in claims.locks.items():
            logical = self.ns.logical(physical)
            if logical is None:
                raise TokenForAnotherLock(f"{call}: the token holds {physical!r}, not a lock "
                                          "of this call")
            fences[logical], modes[logical] = fence, claims.mode_for(physical)
        slot = None
        if call.kind == "permit":
            slot = body.get("slot")
            limit = SEMAPHORES[call.semaphore]
            if not isinstance(slot, int) or not 0 <= slot < limit:
                raise TooManyPermits(f"{call}: slot {slot!r} is outside 0..{limit - 1}")
            wanted = {slot_lock(call.semaphore, slot)}
        else:
            wanted = set(call.locks)
        if set(fences) != wanted:
            raise TokenForAnotherLock(f"{call}: the token holds {sorted(fences)}, the call was "
                                      f"for {sorted(wanted)}")
        said = ({self.ns.logical(x["lock"]): x["fence"] for x in body["locks"]}
                if call.kind == "multi" else {self.ns.logical(body["lock"]): body["fence"]})
        if said != fences:
            raise TokenForAnotherLock(f"{call}: the body says {said}, the token {fences}")
        return fences, modes, slot

    def _answered_with(self, known: Lease, call: Call, fences: dict[str, int],
                       token_modes: dict[str, str]) -> None:
        """A 200 carrying an earlier lease (a client_id retry): it must be live, and its token
        must hold its locks at their fences in the lease's own modes."""
        for lock, fence in fences.items():
            if lock not in known.fences:
                raise TokenForAnotherLock(f"{call} answered with {known!r}, which does not hold "
                                          f"{lock}")
            if token_modes[lock] != known.modes[lock]:
                report(TokenModeNotLeaseMode,
                       f"{call} answered with {known!r}: the answer's token holds {lock} "
                       f"{token_modes[lock]}, the lease holds it {known.modes[lock]}")
            if fence != known.fences[lock]:
                raise TokenForAnotherLock(f"{call} answered with {known!r} at fence {fence} "
                                          f"for {lock}")
            if lock not in known.held:
                raise Disagreement(f"{call} answered with {known!r}, which no longer holds "
                                   f"{lock} (released, expired or force-released)")

    @staticmethod
    def _verifiable(call: Call, body: dict, refusal: str | None) -> None:
        if refusal is not None:
            report(InvalidTokenIssued, f"{call}: lease {body['lease_id']!r} came with a token "
                   f"lockd's keys refuse: {refusal}")

    def _check_fence(self, call: Call, lock: str, mode: str, fence: int) -> None:
        book = self.books[lock]
        if mode == EXCLUSIVE:
            if fence <= book.issued:
                report(GrantDidNotRaise, f"{call}: exclusive grant of {lock} at fence {fence}, "
                       f"not above {book.issued} issued before")
        elif book.unclean is None and fence < book.issued:
            report(SharedEpochWrong, f"{call}: shared grant of {lock} at fence {fence}, below "
                   f"the current fence {book.issued}")
        elif book.unclean and fence <= book.issued:
            report(SharedEpochWrong,
                   f"{call}: shared grant of {lock} at fence {fence} right after an exclusive lease "
                   f"(fence {book.exclusive}) ended by expiry or force-release: no new epoch above "
                   f"{book.issued}")
        elif book.unclean is False and fence != book.issued:
            report(SharedEpochWrong, f"{call}: shared grant of {lock} at fence {fence}, the "
                   f"current fence is {book.issued}")

    def _record(self, lease: Lease) -> None:
        self.leases.append(lease)
        self.by_id[lease.lease_id] = lease
        for lock, fence in lease.fences.items():
            book = self.books[lock]
            book.issued = max(book.issued, fence)
            if lease.modes[lock] == EXCLUSIVE:  # max: a grant that went back was reported
                book.exclusive = max(book.exclusive, fence)
            book.unclean = False
        if lease.kind == "permit":
            self.sem_fence[lease.name] = lease.fences[slot_lock(lease.name, lease.slot)]
        self.check_holders()

    # --- ends -----------------------------------------------------------------------------

    def end(self, lease: Lease, locks: list[str] | None = None, *,
            unclean: bool | None) -> None:
        """``lease`` no longer holds ``locks`` (default: any); it can no longer be renewed.
        ``unclean``: True for an expiry or a force-release, False for a release that answered
        200, None when the model cannot tell (the release of a multi-lock lease that an operator
        cut a lock from answers 410, yet frees the rest: lockd may count that end either way)."""
        for lock in list(lease.held) if locks is None else locks:
            if lock in lease.held:
                lease.held.discard(lock)
                if lease.modes[lock] == EXCLUSIVE:
                    self.books[lock].unclean = unclean
        lease.renewable = False

    # --- the state invariants -------------------------------------------------------------

    def check_holders(self) -> None:
        """Per lock one live exclusive lease or only shared ones; per election one leader; per
        semaphore at most ``limit`` live permits, one per slot."""
        for lock in LOCKS:
            held = self.holdings(lock)
            if len(held) > 1 and any(mode == EXCLUSIVE for _, mode in held):
                report(TwoHolders, f"{lock} is held by {[lease for lease, _ in held]}")
            leaders = [lease for lease, _ in held if lease.kind == "leader"]
            if len(leaders) > 1:
                report(TwoLeaders, f"election {lock} has leaders {leaders}")
        for semaphore, limit in SEMAPHORES.items():
            permits = self.permits(semaphore)
            slots = [p.slot for p in permits]
            if len(permits) > limit or len(set(slots)) != len(slots):
                raise TooManyPermits(f"semaphore {semaphore} (limit {limit}) has live permits "
                                     f"{permits}")
