"""Access control over TLS: API and admin keys keep working over https, and under mTLS a client
certificate's subject can stand for a key (``LOCKD_CERT_CLIENTS``/``LOCKD_CERT_ADMINS``,
``PROXY_CERT_CLIENTS``): a listed client subject may do what a client API key allows, a listed
admin subject what an admin key allows (force-release); any other certificate from the CA gets
through the handshake but still needs a key."""

from __future__ import annotations

import httpx

from harness.certs import ADMIN_SUBJECT, CLIENT_SUBJECT
from lockd import FencedSession, LockClient

KEY, ADMIN = "client-key-0123456789", "admin-key-0123456789"


def _bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _acquire(url, verify, name, key=None) -> httpx.Response:
    return httpx.post(f"{url}/v1/locks/{name}/acquire", json={"ttl_ms": 60_000},
                      headers=_bearer(key), verify=verify)


def _force(url, verify, name, key=None) -> httpx.Response:
    return httpx.post(f"{url}/v1/locks/{name}/force-release", headers=_bearer(key),
                      verify=verify)


def test_api_and_admin_keys_over_https(servers, name):
    lockd = servers.lockd(env={"LOCKD_API_KEYS": KEY, "LOCKD_ADMIN_KEYS": ADMIN})
    verify = servers.verify()
    assert _acquire(lockd.url, verify, name).status_code == 401
    assert _acquire(lockd.url, verify, name, "wrong-key-0123456").status_code == 401
    assert _acquire(lockd.url, verify, name, KEY).status_code == 200
    assert _force(lockd.url, verify, name, KEY).status_code == 403
    forced = _force(lockd.url, verify, name, ADMIN)
    assert forced.status_code == 200 and forced.json()["released"] is True
    with LockClient(lockd.url, verify=verify, api_key=KEY) as client:
        assert client.status(name).held is False


def test_client_certificate_subjects_stand_for_client_and_admin_keys(servers, pki, name):
    lockd = servers.lockd(mtls=True, env={
        "LOCKD_API_KEYS": KEY, "LOCKD_CERT_CLIENTS": f" {CLIENT_SUBJECT.replace(',', ', ')} ",
        "LOCKD_CERT_ADMINS": ADMIN_SUBJECT})
    as_client, as_admin = servers.verify(pki.client), servers.verify(pki.admin)
    nobody = pki.issue("nobody", "nobody.test")  # signed by the CA, subject not listed
    as_nobody = servers.verify(nobody)

    assert _acquire(lockd.url, as_client, name).status_code == 200  # no key: the cert is one
    assert _force(lockd.url, as_client, name).status_code == 403  # a client, not an admin
    assert _acquire(lockd.url, as_nobody, name + "/n").status_code == 401  # handshake ok, no role
    assert _acquire(lockd.url, as_nobody, name + "/n", KEY).status_code == 200  # keys still work
    forced = _force(lockd.url, as_admin, name)
    assert forced.status_code == 200 and forced.json()["released"] is True
    with LockClient(lockd.url, verify=str(pki.ca), cert=pki.client.tuple) as client:
        assert client.try_acquire(name, ttl=5) is not None


def test_client_subjects_alone_turn_access_control_on(servers, pki, name):
    lockd = servers.lockd(mtls=True, env={"LOCKD_CERT_CLIENTS": CLIENT_SUBJECT})
    nobody = pki.issue("nobody-alone", "nobody.test")
    assert _acquire(lockd.url, servers.verify(nobody), name).status_code == 401
    assert _acquire(lockd.url, servers.verify(pki.client), name).status_code == 200
    assert httpx.get(lockd.url + "/metrics", verify=servers.verify(nobody)).status_code == 200


def test_admin_subjects_alone_enable_force_release(servers, pki, name):
    lockd = servers.lockd(mtls=True, env={"LOCKD_CERT_ADMINS": ADMIN_SUBJECT})
    as_client, as_admin = servers.verify(pki.client), servers.verify(pki.admin)
    assert _acquire(lockd.url, as_client, name).status_code == 200  # no access control on
    assert _force(lockd.url, as_client, name).status_code == 401
    assert _force(lockd.url, as_admin, name).json()["released"] is True


def test_proxy_client_certificate_subject_stands_for_an_api_key(servers, pki, name):
    name = "items"  # no policy: table items is written under the lock named items
    lockd = servers.lockd()
    proxy = servers.proxy(lockd.url, mtls=True, env={
        "PROXY_API_KEYS": KEY, "PROXY_CERT_CLIENTS": CLIENT_SUBJECT})
    nobody = pki.issue("nobody-proxy", "nobody.test")
    with LockClient(lockd.url, verify=str(pki.ca)) as client, client.lock(name, ttl=5) as lease:
        with FencedSession(proxy.url, lease, verify=str(pki.ca), cert=pki.client.tuple) as db:
            db.insert("items", {"id": "by-cert", "v": "x", "n": 1})
        fence = httpx.get(f"{proxy.url}/v1/fences/{name}", verify=servers.verify(nobody))
        assert fence.status_code == 401
        fence = httpx.get(f"{proxy.url}/v1/fences/{name}", verify=servers.verify(nobody),
                          headers=_bearer(KEY))
        assert fence.status_code == 200 and fence.json()["highest"] == lease.fence
