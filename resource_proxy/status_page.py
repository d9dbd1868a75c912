"""The proxy's live status page (``GET /``): plain HTML with inline JavaScript, no build step.

It reads ``GET /v1/activity`` once a second and shows the highest fence per recently fenced
lock and the latest rejected fenced calls (stale tokens with presented and highest fence). When
the proxy answers 401 the page asks for an API key (kept in the tab's ``sessionStorage``).
"""

from __future__ import annotations

__all__ = ["STATUS_PAGE"]

STATUS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>resource-proxy status</title>
<style>
  :root { --fg: #1d2329; --muted: #6b7580; --line: #e3e7eb; --bad: #b4490d; --ok: #2c7a3f;
          --bg: #f7f8fa; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
         color: var(--fg); background: var(--bg); }
  header { display: flex; align-items: baseline; gap: 16px; padding: 14px 24px;
           background: #fff; border-bottom: 1px solid var(--line); }
  header h1 { margin: 0; font-size: 18px; }
  #conn { color: var(--muted); font-size: 13px; }
  #conn.live::before { content: "\\25CF\\00a0"; color: var(--ok); }
  #conn.down::before { content: "\\25CF\\00a0"; color: var(--bad); }
  main { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); gap: 20px;
         padding: 20px 24px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; }
  h2 { font-size: 14px; margin: 0 0 8px; color: var(--muted); text-transform: uppercase;
       letter-spacing: .04em; }
  table { width: 100%; border-collapse: collapse; }
  th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; }
  th { font-weight: 600; color: var(--muted); font-size: 12px; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  td.lock { font-family: ui-monospace, monospace; white-space: normal; word-break: break-all; }
  .code-stale_token { color: var(--bad); font-weight: 600; }
  .empty { color: var(--muted); padding: 10px 0; }
  #auth { display: none; padding: 12px 24px; background: #fff4e5; border-bottom: 1px solid var(--line); }
  #auth input { font: inherit; padding: 3px 6px; width: 22em; }
</style>
</head>
<body>
<header><h1>resource-proxy status</h1><span id="conn" class="down">connecting</span>
<span id="summary" style="color: var(--muted)"></span></header>
<form id="auth"><label>This proxy needs an API key:
  <input id="key" type="password" autocomplete="off"></label> <button>Use key</button></form>
<main>
<section><h2>Highest fences</h2>
<table id="fences"><thead><tr><th>Lock</th><th>Highest</th><th>Last fenced</th></tr></thead>
<tbody></tbody></table><div id="nofences" class="empty">No fenced calls yet.</div></section>
<section><h2>Recent rejections</h2>
<table id="rejections"><thead><tr><th>Time</th><th>Call</th><th>Rejection</th><th>Lock</th>
<th>Presented</th><th>Highest</th></tr></thead><tbody></tbody></table>
<div id="norejections" class="empty">No rejections.</div></section>
</main>
<script>
"use strict";
let key = sessionStorage.getItem("proxy-key") || "";
const $ = (id) => document.getElementById(id);
function cell(text, cls) {
  const td = document.createElement("td"); td.textContent = text == null ? "-" : String(text);
  if (cls) td.className = cls; return td;
}
function time(ms) { return new Date(ms).toLocaleTimeString(); }
function fill(id, rows, make) {
  const body = $(id).tBodies[0]; body.replaceChildren();
  for (const r of rows) body.append(make(r));
  $("no" + id).style.display = rows.length ? "none" : "";
}
async function poll() {
  try {
    const r = await fetch("/v1/activity", {headers: key ? {"Authorization": "Bearer " + key} : {}});
    if (r.status === 401) { $("auth").style.display = "block"; setConn(false, "API key needed"); return; }
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
function setConn(ok, text) { const c = $("conn"); c.className = ok ? "live" : "down"; c.textContent = text; }
$("auth").addEventListener("submit", (e) => {
  e.preventDefault(); key = $("key").value.trim(); sessionStorage.setItem("proxy-key", key);
  $("auth").style.display = "none"; poll();
});
poll();
setInterval(poll, 1000);
</script>
</body>
</html>
"""
