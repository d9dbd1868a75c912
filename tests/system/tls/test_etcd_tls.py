"""lockd on a 3-member etcd cluster that speaks only TLS and requires client certificates.

Every member serves its client and peer ports over TLS (``--client-cert-auth``,
``--peer-client-cert-auth``; ``harness.etcd.EtcdCluster(tls=pki)``); lockd reaches it with
``etcd://…?ca=…&cert=…&key=…`` (the store URL's query, see docs/stores/etcd.md). The
contract suite's core cases run unchanged against that lockd; two more tests show the TLS is
real: without a client certificate, or over plain http, lockd cannot start on this cluster.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from harness.certs import make_pki
from harness.etcd import EtcdCluster, etcd_available
from harness.servers import LockdServer
from tests.conftest import require
from tests.server import test_contract as contract


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory):
    require(etcd_available(), "etcd")
    pki = make_pki(tmp_path_factory.mktemp("etcd-pki"))
    cluster = EtcdCluster(3, tls=pki).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def lockd(tls_etcd: EtcdCluster, tmp_path: Path):
    server = LockdServer(tls_etcd.url(f"t-{uuid.uuid4().hex[:12]}"), key_dir=tmp_path / "keys", log_dir=tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def http():
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
def name() -> str:
    return f"test/{uuid.uuid4().hex[:12]}"


# The contract suite's core cases, unchanged (tests.server.test_contract), on the TLS cluster.
test_fence_increases_across_release_expiry_and_restarts = \
    contract.test_fence_increases_across_release_expiry_and_restarts
test_expired_holder_loses_lock_and_waiter_is_granted_promptly = \
    contract.test_expired_holder_loses_lock_and_waiter_is_granted_promptly
test_release_hands_the_lock_to_waiters_in_arrival_order = \
    contract.test_release_hands_the_lock_to_waiters_in_arrival_order
test_renew_without_ttl_keeps_the_lease_own_ttl = contract.test_renew_without_ttl_keeps_the_lease_own_ttl
test_retried_acquire_with_same_client_id_returns_the_same_lease = \
    contract.test_retried_acquire_with_same_client_id_returns_the_same_lease
test_get_shows_holder_fence_and_waiters = contract.test_get_shows_holder_fence_and_waiters
test_tokens_verify_against_jwks_and_the_key_survives_restart = \
    contract.test_tokens_verify_against_jwks_and_the_key_survives_restart


def _start_fails(store_url: str, tmp_path: Path) -> str:
    """Start ``lockd serve`` on ``store_url``; it must exit 1; return its log."""
    server = LockdServer(store_url, key_dir=tmp_path / "keys", log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="exited with 1") as failure:
        server.start()
    return str(failure.value)


def test_etcd_refuses_lockd_without_a_client_certificate(tls_etcd, tmp_path):
    url = tls_etcd.url("t-nocert").split("?")[0] + f"?ca={tls_etcd.tls.ca}&timeout=1"
    log = _start_fails(url, tmp_path)
    assert "lockd cannot start" in log and "etcd did not answer" in log


def test_plain_http_to_the_tls_cluster_is_not_served(tls_etcd, tmp_path):
    log = _start_fails(tls_etcd.url("t-plain").split("?")[0] + "?timeout=1", tmp_path)
    assert "lockd cannot start" in log and "etcd did not answer" in log


def test_tls_query_parameters_switch_every_endpoint_to_https(pki):
    from lockd.server.store.etcd import etcd_tls, parse_etcd_url

    plain = "etcd://a:1,b/app?timeout=2"
    assert parse_etcd_url(plain)[0] == ["http://a:1", "http://b:2379"] and etcd_tls(plain) is None
    for query in (f"ca={pki.ca}", f"ca={pki.ca}&cert={pki.client.cert}&key={pki.client.key}",
                  "tls=1"):
        url = f"etcd://a:1,b/app?timeout=2&{query}"
        assert parse_etcd_url(url) == (["https://a:1", "https://b:2379"], "app", 2.0)
        assert etcd_tls(url) is not None
    with pytest.raises(ValueError, match="both cert= and key="):
        etcd_tls(f"etcd://a:1?cert={pki.client.cert}")
    with pytest.raises(ValueError, match="cannot use its TLS files"):
        etcd_tls(f"etcd://a:1?ca={pki.dir}/missing.pem")
