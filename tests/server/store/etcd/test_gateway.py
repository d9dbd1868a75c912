"""The etcd store's lean gateway client (``lockd.server.store.etcd.gateway``) against real etcd."""

from __future__ import annotations

import asyncio
import json

from lockd.server.store.etcd.gateway import GatewayPool


def test_an_error_answer_with_trailers_leaves_the_connection_usable(etcd_shared_cluster):
    """etcd answers a gRPC error (e.g. revoking an unknown lease: 404) chunked WITH a trailer
    field after the last chunk; the client must read past it, or the next request on that
    pooled connection reads the trailer as its answer."""
    endpoint = f"http://{etcd_shared_cluster.endpoints[0]}"

    async def body():
        pool = GatewayPool(max_connections=1, max_idle=1)
        try:
            status, data = await pool.post(endpoint, "/v3/lease/revoke", b'{"ID":"12345"}', 5)
            assert status == 404 and b"lease not found" in data
            for _ in range(3):  # the same (only) pooled connection
                status, data = await pool.post(endpoint, "/v3/kv/range",
                                               b'{"key":"eA==","count_only":true}', 5)
                assert status == 200 and "header" in json.loads(data)
        finally:
            await pool.aclose()

    asyncio.run(body())
