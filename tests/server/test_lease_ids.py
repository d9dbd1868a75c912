"""Lease ids the server issues: unguessable, and safe to pass as a command-line argument."""

import re

from lockd.server.core.base import new_lease_id


def test_lease_ids_never_begin_with_a_dash():
    """A lease id is pasted into shells (``lockctl renew NAME LEASE_ID``); one beginning with
    ``-`` is taken for an option by every argument parser, so the server never issues one. One
    random id in 64 began with ``-`` before; 20,000 draws leave no room for luck."""
    ids = [new_lease_id() for _ in range(20_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{31}", i) for i in ids)
    assert len(set(ids)) == len(ids)
