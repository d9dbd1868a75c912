"""The two resource kinds answer one token the same way: a row's write and an object's write
go through the one fence core (the token header, its verification, the one write rule), so
each way a token can fail is the same status and ``code`` for both. One proxy serves the table
``items`` (its lock: ``items``) and a bucket (its lock: the bucket's name)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.proxy.objects.conftest import Objects, bucket, start_objects_proxy, stop_objects_proxy

Write = Callable[[str, dict[str, str]], httpx.Response]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Objects]:
    backend = request.param
    admin = request.getfixturevalue("pg_admin_dsn") if backend == "postgres" else None
    directory = tmp_path_factory.mktemp(f"kinds-{backend}")
    proxy = start_objects_proxy(backend, directory, admin, inline_max=None)
    try:
        yield proxy
    finally:
        stop_objects_proxy(proxy, admin)
        shutil.rmtree(directory, ignore_errors=True)


def _kinds(served: Objects, name: str) -> dict[str, tuple[str, Write]]:
    """kind -> (its lock, a write of one resource of it with the given headers)."""
    b = bucket()
    return {
        "row": ("items", lambda key, headers: served.client.put(
            f"/v1/tables/items/rows/{name}-{key}", json={"v": key}, headers=headers)),
        "object": (b, lambda key, headers: served.client.put(
            f"/v1/objects/{b}/{key}", content=key.encode(), headers=headers)),
    }


def _answer(response: httpx.Response) -> tuple[int, str | None]:
    code = response.json().get("code") if response.status_code >= 400 else None
    return response.status_code, code


def _token(served: Objects, lock: str, fence: int, **extra) -> dict[str, str]:
    return {"Fencing-Token": served.ring.sign(lock, fence, extra=extra or None)}


CASES: dict[str, tuple[Callable[[Objects, str], dict[str, str]], tuple[int, str]]] = {
    "no token": (lambda s, lock: {}, (428, "token_required")),
    "not a token": (lambda s, lock: {"Fencing-Token": "not.a.token"}, (401, "invalid_token")),
    "an overlong header": (lambda s, lock: {"Fencing-Token": "x" * 5000},
                           (401, "invalid_token")),
    "another lock's token": (lambda s, lock: _token(s, lock + "-other", 10**6),
                             (403, "lock_not_allowed")),
    "a shared hold": (lambda s, lock: _token(s, lock, 10**6, mode="shared"),
                      (403, "shared_token")),
    "a multi-lock token holding it shared": (
        lambda s, lock: {"Fencing-Token": s.ring.sign_many({lock: 10**6, "x-other": 1},
                                                           extra={"shared": [lock]})},
        (403, "shared_token")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_token_gets_the_same_answer_from_both_kinds(served: Objects, case, request):
    headers_for, expected = CASES[case]
    answers = {kind: _answer(write("k", headers_for(served, lock)))
               for kind, (lock, write) in _kinds(served, request.node.name[-12:]).items()}
    assert answers == {"row": expected, "object": expected}, answers


def test_a_stale_token_is_refused_alike_and_a_multi_lock_token_writes_both(served: Objects,
                                                                            request):
    kinds = _kinds(served, f"stale{abs(hash(request.node.name)) % 10**8}")
    for kind, (lock, write) in kinds.items():
        assert write("k", _token(served, lock, 5)).status_code in (200, 201), kind
        stale = write("k", _token(served, lock, 3))
        assert _answer(stale) == (409, "stale_token"), (kind, stale.text)
        body = stale.json()
        assert (body["lock"], body["presented"], body["highest"]) == (lock, 3, 5), kind
    both = {"Fencing-Token": served.ring.sign_many({lock: 7 for lock, _ in kinds.values()})}
    for kind, (_, write) in kinds.items():
        assert write("k", both).status_code == 200, kind
