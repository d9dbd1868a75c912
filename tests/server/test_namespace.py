"""One namespace: no primitive may use a name another primitive owns, on any of its routes.

Semaphore permits fence the locks ``sem/{name}/{slot}`` with the semaphore's own fence counter;
an election or a lock of such a name would mint a second token for the same slot from the lock
table's counter and fence the live permit holder out. Every route of every primitive refuses
such a name with 422 naming the owner, and nothing changes at the store.
"""

from __future__ import annotations

import importlib

import pytest

from tests.server.calls import acquire, assert_problem
from tests.server.election_calls import call, campaign

ADMIN_KEY = "admin-key-0123456789abcdef"


def _permit(http, url, sem: str, **fields) -> dict:
    r = http.post(f"{url}/v1/semaphores/{sem}/acquire",
                  json={"limit": 2, "ttl_ms": 30_000, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def _refused_for_semaphores(r) -> dict:
    body = assert_problem(r, 422, "invalid_request")
    assert body["owner"] == "semaphore" and body["reserved"] == "sem/", body
    assert "semaphore" in body["detail"] and "sem/" in body["detail"], body
    return body


def test_an_election_on_a_semaphore_slot_is_refused_and_the_permit_keeps_its_slot(
        lockd, http, name):
    url = lockd.url
    sem = f"{name}/enc"
    permit = _permit(http, url, sem, owner="encoder")
    slot = permit["lock"]
    assert slot == f"sem/{sem}/0"
    body = _refused_for_semaphores(campaign(http, url, slot, owner="thief", value="v"))
    assert body["lock"] == slot
    for action, fields in [("renew", {"lease_id": permit["lease_id"]}),
                           ("resign", {"lease_id": permit["lease_id"]}),
                           ("proclaim", {"lease_id": permit["lease_id"], "value": "x"}),
                           ("handover", {"lease_id": permit["lease_id"], "target": "next"})]:
        _refused_for_semaphores(call(http, url, slot, action, **fields))
    _refused_for_semaphores(http.get(f"{url}/v1/elections/{slot}"))
    _refused_for_semaphores(http.get(f"{url}/v1/elections/{slot}/observe"))
    # The permit holder is untouched: same slot, same fence, still renewable.
    renewed = http.post(f"{url}/v1/semaphores/{sem}/renew",
                        json={"lease_id": permit["lease_id"]})
    assert renewed.status_code == 200, renewed.text
    assert (renewed.json()["slot"], renewed.json()["fence"]) == (0, permit["fence"])
    state = http.get(f"{url}/v1/semaphores/{sem}").json()
    assert [(p["owner"], p["slot"], p["fence"]) for p in state["permits"]] == [
        ("encoder", 0, permit["fence"])]


def test_every_lock_route_refuses_a_reserved_name(store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY})
    url, slot = lockd.url, f"sem/{name}/0"
    _refused_for_semaphores(acquire(http, url, slot))
    _refused_for_semaphores(acquire(http, url, slot, mode="shared"))
    _refused_for_semaphores(http.post(f"{url}/v1/leases/acquire",
                                      json={"ttl_ms": 1000, "locks": [name, slot]}))
    _refused_for_semaphores(http.post(f"{url}/v1/locks/{slot}/renew",
                                      json={"lease_id": "x" * 32}))
    _refused_for_semaphores(http.post(f"{url}/v1/locks/{slot}/release",
                                      json={"lease_id": "x" * 32}))
    _refused_for_semaphores(http.get(f"{url}/v1/locks/{slot}"))
    _refused_for_semaphores(http.post(f"{url}/v1/locks/{slot}/force-release",
                                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}))
    assert http.get(f"{url}/v1/locks", params={"prefix": "sem/"}).json()["items"] == []


def test_a_semaphore_may_have_any_lock_name_its_slots_are_its_own(lockd, http, name):
    """A semaphore named like a slot (``sem/...``) mints ``sem/sem/...`` slots: still its own."""
    permit = _permit(http, lockd.url, f"sem/{name}")
    assert permit["lock"] == f"sem/sem/{name}/0"


# --- the table ----------------------------------------------------------------------------------


def _ns():
    return importlib.import_module("lockd.common.namespace")


def _primitive(kind: str):
    return next(p for p in _ns().PRIMITIVES if p.kind == kind)


@pytest.mark.parametrize(("kind", "name", "owner"), [
    ("lock", "sem/x/0", "semaphore"),
    ("lock", "sem/", None),  # not a lock name at all (empty segment)
    ("election", "sem/enc/0", "semaphore"),
    ("election", "sem/a", "semaphore"),
])
def test_a_name_under_another_primitives_reservation_is_refused(kind, name, owner):
    namespace = _ns()
    with pytest.raises(namespace.NameRefused) as refused:
        namespace.check(_primitive(kind), name)
    assert refused.value.owner == owner
    assert refused.value.name == name


@pytest.mark.parametrize("name", ["sem", "semaphores/x", "a/sem/x", "jobs/nightly", "sem.x/0"])
def test_names_outside_every_reservation_belong_to_locks_and_elections(name):
    namespace = _ns()
    for primitive in (namespace.LOCK, namespace.ELECTION):
        assert namespace.check(primitive, name) == name
    assert namespace.owner_of(name) is None


def test_a_semaphores_slot_locks_are_its_own_and_must_fit():
    namespace = _ns()
    assert namespace.check(namespace.SEMAPHORE, "sem/x", slots=3) == "sem/x"
    assert namespace.owner_of("sem/x/2") is namespace.SEMAPHORE
    assert namespace.token_lock(namespace.SEMAPHORE, "pool", 2) == "sem/pool/2"
    with pytest.raises(namespace.NameRefused):
        namespace.check(namespace.SEMAPHORE, "n" * 248, slots=1000)


def test_only_the_owner_may_mint_a_token_for_a_name():
    namespace = _ns()
    assert namespace.mints(namespace.SEMAPHORE, "sem/pool/2")
    assert not namespace.mints(namespace.LOCK, "sem/pool/2")
    assert not namespace.mints(namespace.ELECTION, "sem/pool/2")
    assert not namespace.mints(namespace.SEMAPHORE, "pool/2")
    assert namespace.mints(namespace.LOCK, "pool/2") and namespace.mints(namespace.ELECTION, "p")


def test_a_new_reservation_is_one_row_of_the_table():
    namespace = _ns()
    rows = {p.kind: p for p in namespace.PRIMITIVES}
    assert set(rows) == {"lock", "election", "semaphore"}
    assert [p.reserves for p in namespace.PRIMITIVES if p.reserves] == ["sem/"]


def test_the_signer_refuses_a_lock_its_primitive_does_not_own(tmp_path):
    """The last door: even a grant of a reserved name that reached the lock service (a store
    bug, an old database) is not signed; the semaphore's own slot is."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from lockd.common.namespace import ELECTION, LOCK, SEMAPHORE
    from lockd.server.core.signer import Signer
    from lockd.server.errors import LockdError
    from lockd.tokens import KeyRing

    signer = Signer(KeyRing(Ed25519PrivateKey.generate()))
    assert signer.token("sem/pool/0", 3, primitive=SEMAPHORE)
    for primitive in (LOCK, ELECTION):
        with pytest.raises(LockdError) as refused:
            signer.token("sem/pool/0", 4, primitive=primitive)
        assert refused.value.status == 500 and "sem/pool/0" in refused.value.detail
    assert signer.token("pool/0", 4) and signer.token("pool/0", 4, primitive=ELECTION)
    with pytest.raises(LockdError):  # every lock of a set's token, too
        signer.set_token("m.lease", {"pool/1": 2, "sem/pool/0": 4}, {})
