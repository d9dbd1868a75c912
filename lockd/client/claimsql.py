"""Which ``fencing`` function claims a fence, for both ways ``fenced_transaction`` sends its
claims (``sqlfence``'s statements and ``sqlfence_psycopg``'s one message): the purpose of the
hold decides it, as the one write rule says (``lockd.common.fencerule``)."""

from __future__ import annotations

from lockd.common.fencerule import Fence

__all__ = ["claim_function"]


def claim_function(fence: Fence) -> str:
    """The ``fencing`` function claiming ``fence`` for its purpose: ``claim`` for a lock held
    exclusively (to write), ``claim_read`` for one held shared (to read). Both paths use it."""
    fn = "claim" if fence.writes else "claim_read"
    return fn
