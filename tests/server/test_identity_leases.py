"""``--max-leases-per-identity`` holds under concurrency on every kind of lease: 30 acquires sent
at once by 30 threads to a real ``lockd serve`` with a limit of 3 get exactly 3 leases and 27
answers 429 ``too_many_leases`` with ``Retry-After``. An acquire counts from the moment it is
accepted until it is answered; one that is not granted (409, a wait that ends, a client that
goes away) gives its place back."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from tests.server.calls import assert_problem, wait_until

LIMIT = 3
CALLERS = 30


def _acquire_call(kind: str, run: str, i: int) -> tuple[str, dict]:
    """(path, body) of the ``i``-th acquire of ``kind``."""
    if kind == "lock":
        return f"/v1/locks/{run}/l{i}/acquire", {"ttl_ms": 30_000}
    if kind == "shared":
        return f"/v1/locks/{run}/shared/acquire", {"ttl_ms": 30_000, "mode": "shared"}
    if kind == "multi":
        return "/v1/leases/acquire", {"ttl_ms": 30_000, "locks": [f"{run}/m{i}/a",
                                                                  f"{run}/m{i}/b"]}
    if kind == "permit":
        return f"/v1/semaphores/{run}/pool/acquire", {"ttl_ms": 30_000, "limit": 100}
    if kind == "election":
        return f"/v1/elections/{run}/e{i}/campaign", {"ttl_ms": 30_000, "value": "v"}
    raise AssertionError(kind)


def _all_at_once(url: str, calls: list[tuple[str, dict]]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(calls))
    answers: list[httpx.Response | None] = [None] * len(calls)

    def send(i: int) -> None:
        path, body = calls[i]
        with httpx.Client(timeout=30) as http:
            http.get(f"{url}/healthz")  # connected before the start
            barrier.wait()
            answers[i] = http.post(url + path, json=body)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(a is not None for a in answers)
    return answers  # type: ignore[return-value]


@pytest.fixture
def limited(lockd_factory, tmp_path):
    return lockd_factory(f"sqlite:///{tmp_path}/lockd.db",
                         env={"LOCKD_MAX_LEASES_PER_IDENTITY": str(LIMIT)})


@pytest.mark.parametrize("kind", ["lock", "shared", "multi", "permit", "election"])
def test_concurrent_acquires_never_exceed_the_identity_limit(limited, kind):
    run = uuid.uuid4().hex[:10]
    answers = _all_at_once(limited.url, [_acquire_call(kind, run, i) for i in range(CALLERS)])
    granted = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert len(granted) == LIMIT, [a.status_code for a in answers]
    for answer in refused:
        assert_problem(answer, 429, "too_many_leases")
        assert int(answer.headers["Retry-After"]) >= 1


def test_an_acquire_that_is_not_granted_gives_its_place_back(limited, http):
    url, run = limited.url, uuid.uuid4().hex[:10]

    def post(path: str, **body) -> httpx.Response:
        return http.post(url + path, json={"ttl_ms": 30_000, **body})

    assert post(f"/v1/locks/{run}/x/acquire").status_code == 200  # 1 lease
    for _ in range(10):  # refused at once (409): each counted only while it was asked
        assert post(f"/v1/locks/{run}/x/acquire").status_code == 409
    assert post(f"/v1/locks/{run}/x/acquire", wait_ms=300).status_code == 409  # a wait ends
    leader = post(f"/v1/elections/{run}/e/campaign")  # 2 leases
    assert leader.status_code == 200, leader.text
    assert post(f"/v1/elections/{run}/e/campaign", wait_ms=300).status_code == 409
    assert post(f"/v1/elections/{run}/e/campaign").status_code == 409
    assert http.post(f"{url}/v1/elections/{run}/e/resign",
                     json={"lease_id": leader.json()["lease_id"]}).status_code == 200  # 1
    assert post(f"/v1/semaphores/{run}/s/acquire", limit=1).status_code == 200  # 2 leases
    assert post(f"/v1/semaphores/{run}/s/acquire", limit=1, wait_ms=300).status_code == 409
    leader = post(f"/v1/elections/{run}/e/campaign")  # 3 leases: none refused still counts
    assert leader.status_code == 200, leader.text
    assert_problem(post(f"/v1/locks/{run}/y/acquire"), 429, "too_many_leases")
    assert http.post(f"{url}/v1/elections/{run}/e/resign",
                     json={"lease_id": leader.json()["lease_id"]}).status_code == 200
    assert post(f"/v1/locks/{run}/y/acquire").status_code == 200  # its place is free again


def test_a_waiting_acquire_holds_its_place_until_its_client_goes_away(limited, http):
    url, run = limited.url, uuid.uuid4().hex[:10]

    def post(path: str, **body) -> httpx.Response:
        return http.post(url + path, json={"ttl_ms": 30_000, **body})

    assert post(f"/v1/locks/{run}/x/acquire").status_code == 200
    assert post(f"/v1/locks/{run}/y/acquire").status_code == 200
    gone: list[type] = []

    def wait_then_hang_up() -> None:  # waits behind our own lease, then hangs up
        try:
            httpx.post(f"{url}/v1/locks/{run}/x/acquire",
                       json={"ttl_ms": 30_000, "wait_ms": 60_000},
                       timeout=httpx.Timeout(10, read=3.0))
        except httpx.ReadTimeout as exc:
            gone.append(type(exc))

    waiter = threading.Thread(target=wait_then_hang_up)
    waiter.start()
    wait_until(lambda: http.get(f"{url}/v1/locks/{run}/x").json()["waiters"] == 1, 10, "queued")
    assert_problem(post(f"/v1/locks/{run}/z/acquire"), 429, "too_many_leases")  # it counts
    waiter.join(10)
    assert gone == [httpx.ReadTimeout]
    # once the server saw it go, its place is free
    wait_until(lambda: post(f"/v1/locks/{run}/z/acquire").status_code == 200, 10,
               "the waiter's place given back")
    assert_problem(post(f"/v1/locks/{run}/w/acquire"), 429, "too_many_leases")
