"""ops/grafana-dashboard.json queries only metrics that exist: every metric name in every panel
expression is exposed by a freshly started lockd or proxy (``/metrics``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.system.ops.conftest import scrape

DASHBOARD = Path(__file__).resolve().parents[3] / "ops" / "grafana-dashboard.json"
_METRIC = re.compile(r"\b((?:lockd|resource_proxy)_[a-z0-9_]+)")


def _expressions(panels: list[dict]) -> list[str]:
    out = []
    for panel in panels:
        out += [t["expr"] for t in panel.get("targets", ()) if t.get("expr")]
        out += _expressions(panel.get("panels", []))
    return out


def test_every_dashboard_metric_exists(start_lockd, start_proxy):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"]
    expressions = _expressions(dashboard["panels"])
    assert len(expressions) >= 15
    wanted = {m for e in expressions for m in _METRIC.findall(e)}
    assert any(m.startswith("lockd_") for m in wanted)
    assert any(m.startswith("resource_proxy_") for m in wanted)
    lockd = start_lockd("sqlite")
    proxy = start_proxy(lockd)
    exposed = scrape(lockd.url).names | scrape(proxy.url).names
    missing = sorted(wanted - exposed)
    assert not missing, f"the dashboard queries metrics nobody exposes: {missing}"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
