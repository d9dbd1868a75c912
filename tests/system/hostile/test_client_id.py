"""The client side: the ``client_id`` the library makes for each acquire call
holds 128 random bits in the form lockd accepts, and lockd accepts it on the wire."""

from __future__ import annotations

import base64
import re

from lockd.client import LockClient
from lockd.client.wire import new_client_id
from lockd.server.core.schemas import CLIENT_ID_PATTERN


def test_the_library_client_id_is_128_random_bits_lockd_accepts(inproc_lockd):
    ids = {new_client_id() for _ in range(1000)}
    assert len(ids) == 1000
    for cid in ids:
        assert re.fullmatch(CLIENT_ID_PATTERN, cid)
        assert len(base64.urlsafe_b64decode(cid + "==")) * 8 >= 128
    srv = inproc_lockd()
    with LockClient(srv.url) as client:
        lease = client.acquire("cid/a", 5.0, auto_renew=False)
        assert lease.fence >= 1
        client.release(lease)
