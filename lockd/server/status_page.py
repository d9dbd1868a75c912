"""lockd's live status page (``GET /``): plain HTML with inline JavaScript, no build step.

The page lists the locks (``GET /v1/locks``, re-read every 2 s) with holder, fence, remaining
TTL (counting down in the browser), waiters and mode (``shared``: the holder whose lease ends
last is shown), the semaphores it has seen a permit event of (``GET /v1/semaphores/{name}``,
re-read every 2 s: permits in use of the limit, holders by slot, waiters), and shows lock events as they happen from the
SSE stream ``GET /v1/events?history=50``: an ``EventSource`` when lockd needs no API key; when
it answers 401, the page asks for a key (kept in the tab's ``sessionStorage`` only) and reads
the same stream with ``fetch`` so it can send ``Authorization: Bearer``. An event updates its
row at once, before the next full re-read. The page itself holds no data and needs no key.
The elections section lists the elections this lockd served (``GET /v1/elections``, re-read
with the locks): leader, value, fence, pending handover and candidates waiting here.
Above them, live charts of the operations strip (``lockd.server.status_charts``), and an
*Activity* sparkline per lock. The header links to ``/docs`` and ``/metrics``; not to a proxy: one lockd serves any number of
proxies and is told of none (each proxy's page links back to its lockd).
"""

from __future__ import annotations

import json

from lockd.common.namespace import PRIMITIVES
from lockd.common.page import status_page
from lockd.server.status_charts import CHARTS_CSS, CHARTS_HTML, CHARTS_JS

__all__ = ["STATUS_PAGE"]

_RESERVED = json.dumps([p.reserves for p in PRIMITIVES if p.reserves])
"""The namespace's reserved prefixes: their locks are shown with their primitive, not listed."""

STATUS_PAGE = status_page(
    title="lockd status", who="lockd", storage_key="lockd-key",
    columns="minmax(0, 3fr) minmax(0, 2fr)",
    css="""
  :root { --held: var(--bad); --free: var(--ok); }
  .held { color: var(--held); font-weight: 600; }
  .free { color: var(--free); }
  tr.flash td { background: #fff4c2; }
  #events { list-style: none; margin: 0; padding: 0; max-height: 70vh; overflow: auto; }
  #events li { padding: 5px 0; border-bottom: 1px solid var(--line); font-size: 13px; }
  #events .t { color: var(--muted); font-variant-numeric: tabular-nums; margin-right: 6px; }
  .ev-acquired { color: var(--accent); font-weight: 600; }
  .ev-released { color: var(--free); font-weight: 600; }
  .ev-expired, .ev-overflow { color: var(--held); font-weight: 600; }
  #elections td { white-space: normal; overflow-wrap: anywhere; }
""" + CHARTS_CSS,
    main=CHARTS_HTML + """<section><h2>Locks</h2>
<table id="locks"><thead><tr><th>Lock</th><th>State</th><th>Holder</th><th>Fence</th>
<th>TTL left</th><th>Waiters</th><th>Mode</th><th>Activity</th></tr></thead><tbody></tbody></table>
<div id="nolocks" class="empty">Loading&hellip;</div>
<h2>Semaphores</h2>
<table id="sems"><thead><tr><th>Semaphore</th><th>In use</th><th>Holders (slot)</th>
<th>Fence</th><th>Waiters</th></tr></thead><tbody></tbody></table>
<div id="nosems" class="empty">Loading&hellip;</div></section>
<section><h2>Elections</h2>
<table id="elections"><thead><tr><th>Election</th><th>Leader</th><th>Value</th><th>Fence</th>
<th>Handover to</th><th>Candidates</th></tr></thead><tbody></tbody></table>
<div id="noelections" class="empty">Loading&hellip;</div></section>
<section><h2>Recent events</h2><ul id="events"></ul>
<div id="noevents" class="empty">Waiting for events&hellip;</div></section>""",
    script=CHARTS_JS + "const RESERVED = " + _RESERVED + """;  // lockd.common.namespace's reservations
const locks = new Map();   // name -> {held, owner, fence, waiters, expiresAt, mode}
const sems = new Map();    // semaphore name -> its GET /v1/semaphores/{name} body
const flashes = new Map(); // name -> highlight until (performance.now())
let stream = null;

function fmtMs(ms) {
  if (ms <= 0) return "-";
  if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 120000) return Math.round(ms / 1000) + " s";
  return Math.round(ms / 60000) + " min";
}
function render() {
  const body = $("locks").tBodies[0];
  const names = [...locks.keys()].sort();
  body.replaceChildren();
  const now = performance.now();
  let held = 0;
  for (const name of names) {
    const l = locks.get(name);
    const left = l.held ? Math.max(0, l.expiresAt - now) : 0;
    const isHeld = l.held && left > 0;
    if (isHeld) held++;
    const tr = document.createElement("tr");
    tr.dataset.lock = name;
    if ((flashes.get(name) || 0) > now) tr.className = "flash";
    tr.append(cell(name, "lock"), cell(isHeld ? "held" : "free", isHeld ? "held" : "free"),
              cell(isHeld ? (l.owner || "(no owner)") : "-"), cell(String(l.fence), "num"),
              cell(isHeld ? fmtMs(left) : "-", "num"), cell(String(l.waiters || 0), "num"),
              cell(isHeld ? (l.mode || "exclusive") : "-"), sparkCell(name));
    body.append(tr);
  }
  $("nolocks").style.display = names.length ? "none" : "";
  const sbody = $("sems").tBodies[0];
  sbody.replaceChildren();
  for (const name of [...sems.keys()].sort()) {
    const s = sems.get(name);
    const tr = document.createElement("tr");
    tr.dataset.semaphore = name;
    tr.append(cell(name, "lock"), cell(s.limit === "?" ? "..." : s.permits.length + " / " + s.limit, "num"),
              cell(s.permits.map(p => (p.owner || "(no owner)") + " (" + p.slot + ")").join(", ") || "-"),
              cell(String(s.fence), "num"), cell(String(s.waiters || 0), "num"));
    sbody.append(tr);
  }
  $("nosems").style.display = sems.size ? "none" : "";
  $("summary").textContent = names.length + " lock(s), " + held + " held";
}
async function refresh() {
  try {
    const r = await fetch("/v1/locks?limit=1000", {headers: headers()});
    if (r.status === 401) { askKey(); return; }
    if (!r.ok) throw new Error("HTTP " + r.status);
    const page = await r.json();
    const now = performance.now();
    for (const s of page.items) {
      if (RESERVED.some((p) => s.lock.startsWith(p))) continue;  // e.g. a semaphore's slot
      locks.set(s.lock, {held: s.held, owner: s.owner, fence: s.fence, waiters: s.waiters,
                         expiresAt: now + s.ttl_ms, mode: s.mode});
    }
    for (const name of sems.keys()) {
      const r = await fetch("/v1/semaphores/" + name, {headers: headers()});
      if (r.ok) sems.set(name, await r.json());
    }
    $("nolocks").textContent = "No locks yet.";  // "Loading..." until the first read
    $("nosems").textContent = "No semaphore seen yet.";
    render();
  } catch (e) { setConn(false, "cannot read locks: " + e.message); }
}
async function refreshElections() {
  try {
    const r = await fetch("/v1/elections", {headers: headers()});
    if (!r.ok) return;
    const items = (await r.json()).items;
    const body = $("elections").tBodies[0];
    body.replaceChildren();
    for (const e of items) {
      const tr = document.createElement("tr");
      tr.dataset.election = e.election;
      tr.append(cell(e.election, "lock"),
                cell(e.leader ? (e.leader.owner || "(no owner)") : "none", e.leader ? "held" : "free"),
                cell(e.value || "-"), cell(String(e.fence), "num"), cell(e.handover_to || "-"),
                cell(String(e.waiters), "num"));
      body.append(tr);
    }
    $("noelections").textContent = "No elections yet.";
    $("noelections").style.display = items.length ? "none" : "";
  } catch (e) { /* the locks' re-read reports the connection */ }
}
function onEvent(type, ev) {
  if (type === "overflow") { addEvent({type: "overflow", lock: "some events were dropped", at: Date.now()}); refresh(); return; }
  addEvent(ev);
  if (ev.mode !== "permit") noteHold(type, ev);
  if (ev.mode === "permit") {  // a permit of semaphore ev.semaphore (its slot's lock: ev.lock)
    const name = ev.semaphore;
    if (!sems.has(name)) sems.set(name, {permits: [], limit: "?", fence: ev.fence, waiters: 0});
    refresh();
    return;
  }
  if (ev.mode === "shared" && type !== "acquired") { refresh(); }  // other readers may hold it
  const l = locks.get(ev.lock) || {waiters: 0};
  if (type === "acquired") {
    Object.assign(l, {held: true, owner: ev.owner, fence: ev.fence, mode: ev.mode || "exclusive",
                      expiresAt: Math.max(l.held && ev.mode ? l.expiresAt : 0, performance.now() + ev.ttl_ms)});
  } else {
    Object.assign(l, {held: false, owner: null});
    if (ev.fence != null) l.fence = Math.max(l.fence || 0, ev.fence);
  }
  locks.set(ev.lock, l);
  flashes.set(ev.lock, performance.now() + 1500);
  render();
}
function addEvent(ev) {
  const li = document.createElement("li");
  const t = document.createElement("span"); t.className = "t";
  t.textContent = new Date(ev.at).toLocaleTimeString();
  const k = document.createElement("span"); k.className = "ev-" + ev.type; k.textContent = ev.type;
  li.append(t, k, document.createTextNode(" " + ev.lock +
    (ev.fence != null ? "  fence " + ev.fence : "") + (ev.owner ? "  by " + ev.owner : "") +
    (ev.mode ? "  (" + ev.mode + ")" : "") + (ev.forced ? "  (forced)" : "")));
  li.dataset.type = ev.type; li.dataset.lock = ev.lock;
  const list = $("events"); list.prepend(li);
  while (list.children.length > 100) list.lastChild.remove();
  $("noevents").style.display = "none";
}
const TYPES = ["acquired", "released", "expired", "overflow"];
function connect() {
  if (stream) stream.close();
  const url = "/v1/events?history=50";
  if (!key && window.EventSource) {
    const es = new EventSource(url);
    es.onopen = () => setConn(true, "live");
    es.onerror = () => setConn(false, "reconnecting");
    for (const t of TYPES) es.addEventListener(t, (m) => onEvent(t, t === "overflow" ? {} : JSON.parse(m.data)));
    stream = es;
  } else {
    stream = fetchStream(url);
  }
}
function fetchStream(url) {
  const ctl = new AbortController();
  (async () => {
    let lastId = null;
    for (;;) {
      try {
        const h = headers(); if (lastId) h["Last-Event-ID"] = lastId;
        const r = await fetch(url, {headers: h, signal: ctl.signal});
        if (r.status === 401) { askKey(); return; }
        setConn(true, "live");
        const reader = r.body.getReader(); const dec = new TextDecoder(); let buf = "";
        for (;;) {
          const {value, done} = await reader.read(); if (done) break;
          buf += dec.decode(value, {stream: true});
          let i;
          while ((i = buf.indexOf("\\n\\n")) >= 0) {
            const block = buf.slice(0, i); buf = buf.slice(i + 2);
            let type = "message", data = "";
            for (const line of block.split("\\n")) {
              if (line.startsWith("event: ")) type = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
              else if (line.startsWith("id: ")) lastId = line.slice(4);
            }
            if (TYPES.includes(type)) onEvent(type, data ? JSON.parse(data) : {});
          }
        }
      } catch (e) { if (ctl.signal.aborted) return; }
      setConn(false, "reconnecting");
      await new Promise((res) => setTimeout(res, 2000));
    }
  })();
  return {close: () => ctl.abort()};
}
function onKey() { refresh(); refreshElections(); connect(); }
refresh();
refreshElections();
connect();
setInterval(refresh, 2000);
setInterval(refreshElections, 2000);
setInterval(() => render(), 250);
sampleMetrics();
setInterval(() => { sampleLocks(); sampleMetrics(); }, 2000);
""",
)
