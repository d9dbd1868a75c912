"""``GET /v1/elections`` lists the elections that were really led through this lockd (a
campaign granted or a leader renewed here), never names that were only observed, so observing
any number of names cannot push real elections out of the list; and a list reads from the store
only the elections that may have changed since it last read them (a write notified, a grant
here, the leader's lease run out), so listing again costs no store reads."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx

from harness import wait_for_async
from lockd.server.app import create_app
from lockd.server.settings import Settings
from tests.server.election_calls import campaign, read_events


def test_observed_names_are_not_listed(lockd_factory, tmp_path, http):
    server = lockd_factory(f"sqlite:///{tmp_path}/lockd.db")
    url, run = server.url, uuid.uuid4().hex[:8]
    assert campaign(http, url, f"{run}/real", owner="r").status_code == 200
    for i in range(3):
        read_events(url, f"{run}/ghost{i}", 1)  # an observe of a name nobody campaigned for
    listed = [e["election"] for e in http.get(f"{url}/v1/elections").json()["items"]]
    assert listed == [f"{run}/real"]


class _Reads:
    """Counts ``elect_get`` calls that reach the (real) store under an ``ElectionService``."""

    def __init__(self, elections) -> None:
        self.count = 0
        inner = elections.store.elect_get

        async def counted(name: str):
            self.count += 1
            return await inner(name)

        elections.store.elect_get = counted

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def _run(tmp_path: Path, body) -> None:
    settings = Settings(store=f"sqlite:///{tmp_path}/inproc.db", key_dir=tmp_path / "keys")
    app = create_app(settings)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            await body(app.state.elections)

    asyncio.run(main())


def test_a_thousand_observed_names_do_not_push_a_real_election_out(tmp_path):
    async def body(elections) -> None:
        await elections.campaign("real", value="v", ttl_ms=30_000, owner="r")
        for i in range(1500):
            await elections.start_observing(f"ghost/{i}", None)
        listed = await elections.known()
        assert [e["election"] for e in listed] == ["real"]
        assert listed[0]["leader"]["owner"] == "r" and listed[0]["value"] == "v"

    _run(tmp_path, body)


def test_listing_again_reads_only_what_changed(tmp_path):
    async def body(elections) -> None:
        reads = _Reads(elections)
        leases = {}
        for i in range(20):
            leases[i] = await elections.campaign(f"e/{i:02}", value=f"v{i}", ttl_ms=30_000,
                                                 owner=f"o{i}")
        first = await elections.known()
        assert [e["election"] for e in first] == [f"e/{i:02}" for i in range(20)]
        assert reads.take() <= 20
        again = await elections.known()
        assert reads.take() == 0  # nothing changed: no store read
        assert [e["value"] for e in again] == [f"v{i}" for i in range(20)]
        assert all(0 < e["leader"]["ttl_ms"] <= 30_000 for e in again)
        await elections.proclaim("e/07", leases[7].lease_id, "changed")
        await elections.resign("e/11", leases[11].lease_id)
        await wait_for_async(lambda: elections._known["e/07"].changed
                             and elections._known["e/11"].changed, timeout=5,
                             what="both writes marked as changes")
        after = {e["election"]: e for e in await elections.known()}
        assert reads.take() == 2  # the two that changed
        assert after["e/07"]["value"] == "changed" and after["e/11"]["leader"] is None
        short = await elections.campaign("e/short", value="s", ttl_ms=200, owner="s")
        assert short.ttl_ms == 200
        await elections.known()

        async def lapsed_in_store() -> bool:  # and past the time its listing stays fresh
            return time.monotonic() >= elections._known["e/short"].fresh_until and \
                (await elections.store.elect_get("e/short")).leader is None

        # its leader's lease runs out, unrenewed (by the store's word): read it again
        await wait_for_async(lapsed_in_store, timeout=5, what="the 200 ms leader lease to lapse")
        reads.take()
        lapsed = {e["election"]: e for e in await elections.known()}
        assert reads.take() == 1 and lapsed["e/short"]["leader"] is None

    _run(tmp_path, body)


def test_the_list_over_http_is_unchanged_in_shape(lockd_factory, tmp_path):
    server = lockd_factory(f"sqlite:///{tmp_path}/lockd.db")
    with httpx.Client(timeout=10) as http:
        assert campaign(http, server.url, "shape/e", owner="o", value="v").status_code == 200
        (item,) = http.get(f"{server.url}/v1/elections").json()["items"]
    assert set(item) == {"election", "leader", "value", "fence", "seq", "handover_to",
                         "waiters", "waiting_owners"}
    assert item["leader"]["owner"] == "o" and item["fence"] >= 1
