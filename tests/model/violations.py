"""What the model test reports: one exception class per broken rule.

Hypothesis tells failures apart by their exception type (and where they were raised), so every
rule has its own class: one run that breaks three rules reports three shrunk examples, not one.
``Violation`` is a broken promise of lockd or of an enforcement path; ``Disagreement`` is lockd
answering other than the model predicts without breaking a safety rule (a refused grant the
model says is free, a 410 for a lease the model says is live): either the model or lockd is
wrong, and the message says which call.

``MODEL_TOLERATE`` (comma-separated class names, e.g. ``SharedEpochWrong``) counts those
violations instead of failing on them, where the model can go on after one (``report``): to
look past a known, not yet fixed break for the others.
"""

from __future__ import annotations

import os
from collections import Counter

__all__ = [
    "TOLERATED", "tolerated", "report", "Violation", "Disagreement", "TwoHolders", "GrantDidNotRaise", "FenceWentBack",
    "SharedEpochWrong", "TokenModeNotLeaseMode", "TokenForAnotherLock", "InvalidTokenIssued", "TooManyPermits",
    "SlotNameAccepted", "TwoLeaders", "SharedLeaseWrote", "StaleTokenWrote",
    "ForeignTokenWrote", "CurrentHolderRefused", "StatusDisagrees", "RetryNotIdempotent",
]


class Violation(AssertionError):
    """A rule the system promises was broken by what it answered."""


class TwoHolders(Violation):
    """A lock had two live leases at once, one of them exclusive."""


class GrantDidNotRaise(Violation):
    """An exclusive grant (or a permit) carried a fence not above every fence issued before."""


class FenceWentBack(Violation):
    """A lock's fence, as lockd reports it, went below one it reported earlier."""


class SharedEpochWrong(Violation):
    """A shared grant carried neither the lock's current fence nor, right after an exclusive
    lease that ended by expiry or force-release, one new raise above it."""


class TokenModeNotLeaseMode(Violation):
    """A token's mode for a lock differs from the mode the lease holds it in."""


class TokenForAnotherLock(Violation):
    """A token (or the lease body) names other locks or fences than the call was for."""


class InvalidTokenIssued(Violation):
    """lockd answered a grant or renewal with a token its own verifier refuses."""


class TooManyPermits(Violation):
    """A semaphore had more live permits than its limit, or two on one slot."""


class SlotNameAccepted(Violation):
    """A route other than a permit's accepted a semaphore slot's lock ``sem/{name}/{slot}``:
    granted it (a fence of the lock table's counter, not the semaphore's, for the slot) or
    answered anything but 422."""


class TwoLeaders(Violation):
    """An election had two live leaders, or lockd named a leader that is not the lock's one
    exclusive holder."""


class SharedLeaseWrote(Violation):
    """A write under a lock the lease holds SHARED committed."""


class StaleTokenWrote(Violation):
    """A write committed with an exclusive fence older than the lock's latest exclusive grant."""


class ForeignTokenWrote(Violation):
    """A write committed under a lock the token does not hold at all."""


class CurrentHolderRefused(Violation):
    """The resource refused the lock's latest grant (its claim or its write) as stale: some
    other path raised the lock's fence past it."""


class StatusDisagrees(Violation):
    """``GET`` of a lock, semaphore or election shows other live holders than were granted."""


class RetryNotIdempotent(Violation):
    """A client_id retry of a live lease (same route, locks and modes) was answered with
    another lease or refused, instead of with that lease."""


class Disagreement(AssertionError):
    """lockd answered a call other than the model predicts (not a safety rule by itself)."""


TOLERATED = frozenset(name for name in os.environ.get("MODEL_TOLERATE", "").replace(" ", "")
                      .split(",") if name)
tolerated: Counter[str] = Counter()
"""How often each tolerated violation happened in this process."""


def report(kind: type[AssertionError], message: str) -> None:
    """Raise ``kind(message)``, or only count it if ``MODEL_TOLERATE`` names it."""
    if kind.__name__ in TOLERATED:
        tolerated[kind.__name__] += 1
        return
    raise kind(message)
