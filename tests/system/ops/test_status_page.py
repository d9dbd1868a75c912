"""The status pages in a real headless Chromium (CDP over a websocket).

lockd's page renders its table, and a lock acquired while the page is open appears without a
reload (the window keeps a marker set before the acquire), through the SSE stream (the event
list is fed by the stream alone). With API keys the page asks for one and then reads the stream
with ``fetch``. The proxy's page shows the highest fence and a stale rejection. Screenshots go
to the test's tmp directory (``OPS_SCREENSHOT_DIR`` copies them somewhere to look at).

Every test runs twice: over plain http, and over https (``scheme``): servers with a test
certificate (``tests.system.tls``), Chromium trusting exactly that certificate's key, so the page, its
``fetch`` calls and the event stream all go over TLS.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import wait_for
from harness.certs import make_pki
from harness.tls_servers import TLSServers
from tests.conftest import IN_CI
from tests.system.ops.browser import Browser, Page, chromium_path


@dataclass
class Stack:
    """How this run starts servers: ``lockd(env=...)``, ``proxy(lockd)``; ``verify`` for httpx;
    ``trust``: certificates the browser accepts (https only)."""

    lockd: Callable[..., Any]
    proxy: Callable[[Any], Any]
    verify: Any
    trust: list[Path]


@pytest.fixture(params=["http", "https"])
def stack(request: pytest.FixtureRequest, tmp_path: Path, start_lockd, start_proxy) -> Stack:
    if request.param == "http":
        return Stack(lambda env=None: start_lockd("sqlite", env=env), start_proxy, True, [])
    pki = make_pki(tmp_path / "pki")
    servers = TLSServers(tmp_path, pki)
    request.addfinalizer(servers.close)
    policy = tmp_path / "policy.yaml"  # as start_proxy's: row r1 is lock items/r1
    policy.write_text("tables: {items: 'items/{key}'}\n")
    return Stack(lambda env=None: servers.lockd(env=env),
                 lambda lockd: servers.proxy(lockd.url, args=("--policy", str(policy))),
                 servers.verify(), [pki.server.cert])


@pytest.fixture
def browser(tmp_path: Path, stack: Stack):
    if chromium_path() is None:
        if IN_CI:
            pytest.fail("chromium is required under CI=true (make system-deps)")
        pytest.skip("chromium is not installed (make system-deps)")
    browser = Browser.start(tmp_path, trust=stack.trust)
    yield browser
    browser.close()


def _keep(shot: Path) -> None:
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    target = os.environ.get("OPS_SCREENSHOT_DIR")
    if target:
        shutil.copy(shot, Path(target) / shot.name)


def _row(name: str) -> str:
    return f"document.querySelector('#locks tr[data-lock=\"{name}\"]')"


def _acquire(url: str, name: str, ttl_ms: int, owner: str, key: str | None = None,
             verify: Any = True) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(f"{url}/v1/locks/{name}/acquire", headers=headers,
                          json={"ttl_ms": ttl_ms, "owner": owner}, verify=verify)
    assert response.status_code == 200, response.text
    return response.json()


def _live(page: Page) -> None:
    page.wait_for("document.getElementById('conn').textContent === 'live'", what="stream live")


def test_lockd_status_page_shows_an_acquire_without_reload(browser, stack, name, tmp_path):
    lockd = stack.lockd()
    before = _acquire(lockd.url, name + "/before", 60_000, "worker-1", verify=stack.verify)
    page = browser.page()
    page.navigate(lockd.url + "/")
    assert page.evaluate("location.protocol") == lockd.url.split("//")[0]
    assert page.evaluate("document.title") == "lockd status"
    assert page.evaluate("!!document.querySelector('table#locks')")
    page.wait_for(_row(name + "/before"), what="the lock acquired before the page opened")
    _live(page)
    assert page.evaluate(f"{_row(name + '/before')}.cells[3].textContent") == str(before["fence"])
    page.evaluate("window.__noReload = 42")
    started = time.monotonic()
    lease = _acquire(lockd.url, name + "/during", 30_000, "worker-2", verify=stack.verify)
    page.wait_for(f"document.querySelector('#events li[data-lock=\"{name}/during\"]"
                  "[data-type=\"acquired\"]')", timeout=5, what="the acquire's event")
    page.wait_for(_row(name + "/during"), timeout=5, what="the acquired lock's row")
    seen_after = time.monotonic() - started
    cells = page.evaluate(f"[...{_row(name + '/during')}.cells].map(c => c.textContent)")
    assert cells[0] == name + "/during" and cells[1] == "held" and cells[2] == "worker-2"
    assert cells[3] == str(lease["fence"]) and cells[4].endswith("s") and cells[5] == "0"
    assert page.evaluate("window.__noReload") == 42  # the same document: no reload happened
    assert seen_after < 2.0  # the stream, not the 2 s re-read, brought it
    httpx.post(f"{lockd.url}/v1/locks/{name}/during/release", json={"lease_id": lease["lease_id"]},
               verify=stack.verify)
    page.wait_for(f"{_row(name + '/during')}.cells[1].textContent === 'free'", timeout=5,
                  what="the release")
    page.wait_for("document.querySelectorAll('#events li').length >= 3", what="three events")
    _keep(page.screenshot(tmp_path / "lockd-status.png"))
    assert page.console == []


def test_lockd_status_page_lists_elections(browser, stack, name, tmp_path):
    lockd = stack.lockd()
    url = f"{lockd.url}/v1/elections/{name}"
    r = httpx.post(f"{url}/campaign", verify=stack.verify,
                   json={"ttl_ms": 60_000, "owner": "leader-1", "value": "host-a:8080"})
    assert r.status_code == 200, r.text
    lease = r.json()
    page = browser.page()
    page.navigate(lockd.url + "/")
    row = f"document.querySelector('#elections tr[data-election=\"{name}\"]')"
    page.wait_for(row, what="the election's row")
    cells = page.evaluate(f"[...{row}.cells].map(c => c.textContent)")
    assert cells == [name, "leader-1", "host-a:8080", str(lease["fence"]), "-", "0"]
    httpx.post(f"{url}/resign", json={"lease_id": lease["lease_id"]}, verify=stack.verify)
    page.wait_for(f"{row}.cells[1].textContent === 'none'", timeout=5, what="the resignation")
    _keep(page.screenshot(tmp_path / "lockd-elections.png"))
    assert page.console == []


def test_lockd_status_page_shows_lock_modes_and_semaphores(browser, stack, name, tmp_path):
    lockd = stack.lockd()
    for owner in ("reader-1", "reader-2"):
        r = httpx.post(f"{lockd.url}/v1/locks/{name}/r/acquire", verify=stack.verify,
                       json={"ttl_ms": 60_000, "owner": owner, "mode": "shared"})
        assert r.status_code == 200, r.text
    page = browser.page()
    page.navigate(lockd.url + "/")
    page.wait_for(_row(name + "/r"), what="the shared lock's row")
    _live(page)
    cells = page.evaluate(f"[...{_row(name + '/r')}.cells].map(c => c.textContent)")
    assert cells[1] == "held" and cells[2] in ("reader-1", "reader-2") and cells[6] == "shared"
    sem = f"{name}/pool"
    row = f"document.querySelector('#sems tr[data-semaphore=\"{sem}\"]')"
    for i in range(2):
        r = httpx.post(f"{lockd.url}/v1/semaphores/{sem}/acquire", verify=stack.verify,
                       json={"limit": 3, "ttl_ms": 60_000, "owner": f"sem-{i}"})
        assert r.status_code == 200, r.text
    page.wait_for(f"{row} && {row}.cells[1].textContent === '2 / 3'", timeout=5,
                  what="the semaphore's row, from its permit events")
    cells = page.evaluate(f"[...{row}.cells].map(c => c.textContent)")
    assert cells[0] == sem and cells[2] == "sem-0 (0), sem-1 (1)" and cells[4] == "0"
    assert page.evaluate(f"!{_row('sem/' + sem + '/0')}")  # slots are not listed as locks
    _keep(page.screenshot(tmp_path / "lockd-modes.png"))
    assert page.console == []


def test_lockd_status_page_with_api_key(browser, stack, name, tmp_path):
    key = "status-page-key-123"
    lockd = stack.lockd(env={"LOCKD_API_KEYS": key})
    page = browser.page()
    page.navigate(lockd.url + "/")  # the page itself is open
    page.wait_for("getComputedStyle(document.getElementById('auth')).display === 'block'",
                  what="the key prompt")
    page.evaluate(f"document.getElementById('key').value = '{key}';"
                  "document.getElementById('auth').requestSubmit()")
    _live(page)
    _acquire(lockd.url, name, 30_000, "keyed", key=key, verify=stack.verify)
    page.wait_for(f"document.querySelector('#events li[data-lock=\"{name}\"]')", timeout=5,
                  what="the event through the fetch-read stream")
    page.wait_for(_row(name), timeout=5, what="the row")


def test_proxy_status_page_shows_fences_and_rejections(browser, stack, tmp_path):
    name = "items/r1"  # the lock of row r1 (policy items/{key})
    lockd = stack.lockd()
    proxy = stack.proxy(lockd)
    page = browser.page()
    page.navigate(proxy.url + "/")
    assert page.evaluate("location.protocol") == proxy.url.split("//")[0]
    assert page.evaluate("document.title") == "resource-proxy status"
    assert page.evaluate("!!document.querySelector('table#fences')")
    page.wait_for("document.querySelector('#bindings tr[data-table=\"items\"]')", timeout=5,
                  what="the table's lock template")
    assert page.evaluate("document.querySelector('#bindings tr[data-table=\"items\"]')"
                         ".cells[1].textContent") == "items/{key}"
    page.evaluate("window.__noReload = 7")
    old = _acquire(lockd.url, name, 300, "a", verify=stack.verify)
    row = f"{proxy.url}/v1/tables/items/rows/r1"
    assert httpx.put(row, json={"id": "r1", "v": "a"},
                     headers={"Fencing-Token": old["token"]}, verify=stack.verify).status_code == 200
    wait_for(lambda: not httpx.get(f"{lockd.url}/v1/locks/{name}", verify=stack.verify
                                   ).json()["held"], timeout=5, what="the 300 ms lease to expire")
    new = _acquire(lockd.url, name, 30_000, "b", verify=stack.verify)
    assert httpx.put(row, json={"id": "r1", "v": "b"},
                     headers={"Fencing-Token": new["token"]}, verify=stack.verify).status_code == 200
    assert httpx.put(row, json={"id": "r1", "v": "stale"},
                     headers={"Fencing-Token": old["token"]}, verify=stack.verify).status_code == 409
    page.wait_for("document.querySelector('#rejections tr[data-code=\"stale_token\"]')",
                  timeout=5, what="the stale rejection")
    cells = page.evaluate("[...document.querySelector('#rejections tr[data-code=\"stale_token\"]')"
                          ".cells].map(c => c.textContent)")
    assert cells[1:] == ["upsert", "stale_token", name, str(old["fence"]), str(new["fence"])]
    fence = page.evaluate(f"document.querySelector('#fences tr[data-lock=\"{name}\"]')"
                          ".cells[1].textContent")
    assert fence == str(new["fence"])
    assert page.evaluate("window.__noReload") == 7
    _keep(page.screenshot(tmp_path / "proxy-status.png"))


def test_proxy_status_page_says_which_tables_are_unfenced(browser, start_lockd, start_proxy, tmp_path):
    policy = tmp_path / "unfenced.yaml"
    policy.write_text("tables: {items: {unfenced: true}}\n")
    proxy = start_proxy(start_lockd("sqlite"), args=("--policy", str(policy)))
    assert "UNFENCED (written without a token): items" in proxy.log()
    page = browser.page()
    page.navigate(proxy.url + "/")
    page.wait_for("document.querySelector('#bindings tr[data-table=\"items\"]')", timeout=5,
                  what="the table's row")
    assert page.evaluate("document.querySelector('#bindings tr[data-table=\"items\"]')"
                         ".cells[1].textContent") == "UNFENCED (written without a token)"
