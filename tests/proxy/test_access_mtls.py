"""``--access-file`` identities by client-certificate subject (mTLS): the subject maps to its
named identity, scoped by ``tables`` (a client) or not at all (an admin)."""

from __future__ import annotations

import httpx

from harness.certs import ADMIN_SUBJECT, CLIENT_SUBJECT
from lockd import LockClient
from tests.system.tls.conftest import pki, servers  # noqa: F401  (fixtures)


def test_a_certificate_subject_is_a_scoped_identity(servers, pki, tmp_path):  # noqa: F811
    access = tmp_path / "access.yaml"
    access.write_text(f'clients:\n  - {{name: reporting, subject: "{CLIENT_SUBJECT}", '
                      f'tables: [ledger]}}\nadmins:\n  - {{name: ops, subject: "{ADMIN_SUBJECT}"}}\n')
    lockd = servers.lockd()
    proxy = servers.proxy(lockd.url, mtls=True, args=("--access-file", str(access)))
    with LockClient(lockd.url, verify=str(pki.ca)) as client, client.lock("items", ttl=10) as lease:
        headers = {"Fencing-Token": lease.token}
        refused = httpx.put(f"{proxy.url}/v1/tables/items/rows/a", json={"v": "x"},
                            headers=headers, verify=servers.verify(pki.client))
        assert refused.status_code == 403, refused.text
        problem = refused.json()
        assert problem["code"] == "forbidden_table"
        assert (problem["table"], problem["identity"]) == ("items", "reporting")
        allowed = httpx.put(f"{proxy.url}/v1/tables/items/rows/a", json={"v": "x"},
                            headers=headers, verify=servers.verify(pki.admin))
        assert allowed.status_code == 200, allowed.text
        nobody = pki.issue("nobody-access", "nobody.test")
        stranger = httpx.put(f"{proxy.url}/v1/tables/items/rows/a", json={"v": "y"},
                             headers=headers, verify=servers.verify(nobody))
        assert stranger.status_code == 401
