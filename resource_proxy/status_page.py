"""The proxy's live status page (``GET /``): plain HTML with inline JavaScript, no build step.

It reads ``GET /v1/activity`` once a second and shows the highest fence per recently fenced
lock and the latest rejected fenced calls (stale tokens with presented and highest fence), and
once, from ``GET /v1/tables``, the lock template that governs each table, with every table the
policy declares unfenced marked UNFENCED (written without a token). When
the proxy answers 401 the page asks for an API key (kept in the tab's ``sessionStorage``).
The header links to ``/docs``, ``/metrics`` and, with ``--lockd-url``, lockd's status page.
"""

from __future__ import annotations

from functools import lru_cache

from lockd.common.page import status_page

__all__ = ["STATUS_PAGE", "render"]


@lru_cache(maxsize=4)
def render(lockd_url: str | None) -> str:
    """The page, linking to lockd's status page at ``lockd_url`` (none when ``None``)."""
    links = [("lockd status", lockd_url.rstrip("/") + "/")] if lockd_url else []
    return status_page(**_PARTS, links=links)


_PARTS = dict(
    title="resource-proxy status", who="proxy", storage_key="proxy-key",
    columns="minmax(0, 2fr) minmax(0, 3fr)",
    css="""
  .code-stale_token { color: var(--bad); font-weight: 600; }
  .unfenced { color: var(--bad); font-weight: 600; }
""",
    main="""<section><h2>Highest fences</h2>
<table id="fences"><thead><tr><th>Lock</th><th>Highest</th><th>Last fenced</th></tr></thead>
<tbody></tbody></table><div id="nofences" class="empty">No fenced calls yet.</div></section>
<section><h2>Recent rejections</h2>
<table id="rejections"><thead><tr><th>Time</th><th>Call</th><th>Rejection</th><th>Lock</th>
<th>Presented</th><th>Highest</th></tr></thead><tbody></tbody></table>
<div id="norejections" class="empty">No rejections.</div></section>
<section><h2>Tables and their locks</h2>
<table id="bindings"><thead><tr><th>Table</th><th>Written under lock</th></tr></thead>
<tbody></tbody></table><div id="nobindings" class="empty">No tables.</div></section>""",
    script="""function time(ms) { return new Date(ms).toLocaleTimeString(); }
function fill(id, rows, make) {
  const body = $(id).tBodies[0]; body.replaceChildren();
  for (const r of rows) body.append(make(r));
  $("no" + id).style.display = rows.length ? "none" : "";
}
async function poll() {
  try {
    const r = await fetch("/v1/activity", {headers: headers()});
    if (r.status === 401) { askKey(); return; }
    if (!r.ok) throw new Error("HTTP " + r.status);
    const a = await r.json();
    fill("fences", a.fences, (f) => {
      const tr = document.createElement("tr"); tr.dataset.lock = f.lock;
      tr.append(cell(f.lock, "lock"), cell(f.highest, "num"), cell(time(f.at))); return tr;
    });
    fill("rejections", a.rejections, (x) => {
      const tr = document.createElement("tr"); tr.dataset.code = x.code;
      tr.append(cell(time(x.at)), cell(x.call), cell(x.code, "code-" + x.code), cell(x.lock, "lock"),
                cell(x.presented, "num"), cell(x.highest, "num")); return tr;
    });
    $("summary").textContent = a.writes_ok_total + " fenced write(s) honoured, " +
                               a.stale_total + " stale rejection(s)";
    setConn(true, "live");
  } catch (e) { setConn(false, "cannot read activity: " + e.message); }
}
async function bindings() {
  const r = await fetch("/v1/tables", {headers: headers()});
  if (!r.ok) return;
  fill("bindings", (await r.json()).items, (b) => {
    const tr = document.createElement("tr"); tr.dataset.table = b.table;
    tr.append(cell(b.table), b.unfenced ? cell("UNFENCED (written without a token)", "unfenced")
                                        : cell(b.lock, "lock")); return tr;
  });
}
function onKey() { poll(); bindings(); }
poll(); bindings();
setInterval(poll, 1000);
""",
)


STATUS_PAGE = render(None)
