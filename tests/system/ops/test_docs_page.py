"""``/docs`` on both servers, in a real headless Chromium that resolves no host but the local
one (``Browser.start(offline=True)``): Swagger UI's script and style come from the server
itself, so the page renders the operations with no network. The status pages link to
``/docs``, ``/metrics`` and (the proxy's) to lockd's status page."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import IN_CI
from tests.system.ops.browser import Browser, Page, chromium_path


@pytest.fixture
def browser(tmp_path: Path):
    if chromium_path() is None:
        if IN_CI:
            pytest.fail("chromium is required under CI=true (make system-deps)")
        pytest.skip("chromium is not installed (make system-deps)")
    browser = Browser.start(tmp_path, offline=True)
    yield browser
    browser.close()


def _operation(path: str, method: str) -> str:
    return (f"document.querySelector('.opblock-{method} .opblock-summary-path"
            f"[data-path=\"{path}\"]')")


def _only_local(page: Page, base: str) -> None:
    """Every resource the page loaded came from ``base`` (the server itself)."""
    loaded = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(url.startswith(base + "/") for url in loaded), loaded


def test_docs_render_offline_on_both_servers(browser, start_lockd, start_proxy, tmp_path):
    lockd = start_lockd("sqlite")
    proxy = start_proxy(lockd)
    page = browser.page()
    page.navigate("https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css")
    assert page.evaluate("document.body.innerText.length < 5000")  # the CDN is out of reach

    page.navigate(lockd.url + "/docs")
    page.wait_for(_operation("/v1/locks/{name}/acquire", "post"), timeout=20,
                  what="lockd's acquire operation in Swagger UI")
    assert page.evaluate("document.querySelector('.info .title').textContent").startswith("lockd")
    _only_local(page, lockd.url)
    page.screenshot(tmp_path / "lockd-docs.png")

    page.navigate(proxy.url + "/docs")
    page.wait_for(_operation("/v1/tables/items/rows", "post"), timeout=20,
                  what="the proxy's insert-row operation in Swagger UI")
    assert page.evaluate(f"Boolean({_operation('/v1/batch', 'post')})")
    _only_local(page, proxy.url)
    assert page.console == []


def test_docs_need_no_api_key(start_lockd):
    lockd = start_lockd("sqlite", env={"LOCKD_API_KEYS": "docs-test-key-1"})
    assert httpx.get(lockd.url + "/v1/locks").status_code == 401
    for path in ("/docs", "/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css", "/openapi.json"):
        assert httpx.get(lockd.url + path).status_code == 200, path
    bundle = httpx.get(lockd.url + "/docs/swagger-ui-bundle.js")
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert "SwaggerUIBundle" in bundle.text[:2000]
    assert "/docs" not in httpx.get(lockd.url + "/openapi.json").json()["paths"]


def _links(page: Page) -> dict[str, str]:
    return page.evaluate("Object.fromEntries([...document.querySelectorAll('#links a')]"
                         ".map(a => [a.textContent, a.href]))")


def test_status_pages_link_to_docs_metrics_and_lockd(browser, start_lockd, start_proxy):
    lockd = start_lockd("sqlite")
    proxy = start_proxy(lockd)
    page = browser.page()
    page.navigate(lockd.url + "/")
    assert _links(page) == {"API docs": lockd.url + "/docs", "Metrics": lockd.url + "/metrics"}
    page.navigate(proxy.url + "/")
    assert _links(page) == {"API docs": proxy.url + "/docs", "Metrics": proxy.url + "/metrics",
                            "lockd status": lockd.url + "/"}
    page.evaluate("document.querySelector('#links a[href$=\"/\"]').click()")
    page.wait_for(f"location.href === '{lockd.url}/' && document.title === 'lockd status'",
                  what="lockd's status page, reached from the proxy's")
