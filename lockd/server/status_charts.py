"""The live charts of lockd's status page: the operations strip drawn in the browser, from
lockd's own ``/metrics`` and lock list, with no library and no CDN (``<canvas>`` and a few
lines of script).

Overall (``#charts``, one sample every 2 s, the last 2 minutes): leases held and acquires
waiting; acquire latency (the mean wait of the acquires answered in each interval, from
``lockd_acquire_wait_seconds``); lease hold time against TTL (the mean hold of the leases that
ended in each interval, ``lockd_lease_hold_seconds``, beside the mean TTL granted,
``lockd_lease_ttl_seconds``); renewal failures per interval (``lockd_renewal_failures_total``);
the store's clock skew (``lockd_store_clock_skew_seconds``). Per lock (the locks table's
*Activity* cell): its waiters over the same 2 minutes, and each hold's share of its TTL (a dot
per hold that ended, from the event stream). Each canvas carries ``data-points``, the samples it
drew, for tests. ``/metrics`` is open even when lockd needs API keys.
"""

from __future__ import annotations

__all__ = ["CHARTS_CSS", "CHARTS_HTML", "CHARTS_JS"]

CHARTS_CSS = """
  #charts { grid-column: 1 / -1; }
  #charts .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(230px, 1fr));
                  gap: 12px; }
  .chart { border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; }
  .chart .k { font-size: 12px; color: var(--muted); }
  .chart .v { font-size: 13px; font-variant-numeric: tabular-nums; float: right; }
  .chart canvas { display: block; width: 100%; height: 56px; }
  td.spark canvas { display: block; width: 120px; height: 22px; }
"""

CHARTS_HTML = """<section id="charts"><h2>Operations, last 2 minutes</h2><div class="grid">
<div class="chart"><span class="k">Leases held / acquires waiting</span><span class="v" id="v-held"></span>
<canvas id="c-held" width="460" height="112"></canvas></div>
<div class="chart"><span class="k">Acquire latency (mean)</span><span class="v" id="v-latency"></span>
<canvas id="c-latency" width="460" height="112"></canvas></div>
<div class="chart"><span class="k">Hold time / lease TTL</span><span class="v" id="v-hold"></span>
<canvas id="c-hold" width="460" height="112"></canvas></div>
<div class="chart"><span class="k">Renewal failures</span><span class="v" id="v-failures"></span>
<canvas id="c-failures" width="460" height="112"></canvas></div>
<div class="chart"><span class="k">Store clock skew</span><span class="v" id="v-skew"></span>
<canvas id="c-skew" width="460" height="112"></canvas></div>
</div></section>
"""

CHARTS_JS = r"""
const CHART_POINTS = 60;                       // 2 minutes at one sample every 2 s
const ops = {held: [], waiting: [], latency: [], hold: [], ttl: [], failures: [], skew: []};
const lockHistory = new Map();                 // lock -> {waiters: [..], holds: [ratio..]}
const grants = new Map();                      // lock -> {at, ttl} of its live grant (events)
let lastMetrics = null;
const COLORS = {a: "#2457a6", b: "#b4490d", c: "#2c7a3f"};

function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const i = line.lastIndexOf(" ");
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}
function total(m, name) {                      // the sum of a family's samples, any labels
  let s = 0;
  for (const [k, v] of m) if (k === name || k.startsWith(name + "{")) s += v;
  return s;
}
function push(list, value) { list.push(value); while (list.length > CHART_POINTS) list.shift(); }
function drawLines(canvas, lines, fixedMax) {
  const g = canvas.getContext("2d"), w = canvas.width, h = canvas.height, pad = 4;
  g.clearRect(0, 0, w, h);
  g.strokeStyle = "#e3e7eb"; g.lineWidth = 1;
  g.beginPath(); g.moveTo(0, h - pad); g.lineTo(w, h - pad); g.stroke();
  let max = fixedMax || 0, min = 0, points = 0;
  for (const l of lines) for (const v of l.values) if (v != null) {
    max = Math.max(max, v); min = Math.min(min, v); points++;
  }
  if (max === min) max = min + 1;
  const y = (v) => h - pad - (v - min) / (max - min) * (h - 2 * pad);
  for (const l of lines) {
    const n = l.values.length, x = (i) => w - (n - 1 - i) * (w / (CHART_POINTS - 1));
    g.strokeStyle = g.fillStyle = l.color; g.lineWidth = 3;
    if (l.dots) {
      l.values.forEach((v, i) => { if (v != null) { g.beginPath(); g.arc(x(i), y(v), 4, 0, 7); g.fill(); } });
      continue;
    }
    g.beginPath(); let started = false;
    l.values.forEach((v, i) => {
      if (v == null) { started = false; return; }
      if (started) g.lineTo(x(i), y(v)); else { g.moveTo(x(i), y(v)); started = true; }
    });
    g.stroke();
  }
  canvas.dataset.points = String(points);
}
function last(list) { for (let i = list.length - 1; i >= 0; i--) if (list[i] != null) return list[i]; return null; }
function drawCharts() {
  drawLines($("c-held"), [{values: ops.held, color: COLORS.a}, {values: ops.waiting, color: COLORS.b}]);
  $("v-held").textContent = (last(ops.held) ?? "-") + " / " + (last(ops.waiting) ?? "-");
  drawLines($("c-latency"), [{values: ops.latency, color: COLORS.a}]);
  const lat = last(ops.latency); $("v-latency").textContent = lat == null ? "-" : lat.toFixed(1) + " ms";
  drawLines($("c-hold"), [{values: ops.ttl, color: COLORS.c}, {values: ops.hold, color: COLORS.b, dots: true}]);
  const hold = last(ops.hold), ttl = last(ops.ttl);
  $("v-hold").textContent = (hold == null ? "-" : hold.toFixed(1) + " s") + " / " + (ttl == null ? "-" : ttl.toFixed(1) + " s");
  drawLines($("c-failures"), [{values: ops.failures, color: COLORS.b}], 1);
  $("v-failures").textContent = String(ops.failures.reduce((a, v) => a + (v || 0), 0));
  drawLines($("c-skew"), [{values: ops.skew, color: COLORS.a}]);
  const skew = last(ops.skew); $("v-skew").textContent = skew == null ? "-" : (skew * 1000).toFixed(0) + " ms";
}
function delta(m, name) { return lastMetrics ? total(m, name) - total(lastMetrics, name) : 0; }
async function sampleMetrics() {
  try {
    const r = await fetch("/metrics");
    if (!r.ok) return;
    const m = parseMetrics(await r.text());
    push(ops.held, total(m, "lockd_leases_active"));
    push(ops.waiting, total(m, "lockd_acquires_waiting"));
    const answered = delta(m, "lockd_acquire_wait_seconds_count");
    push(ops.latency, answered > 0 ? delta(m, "lockd_acquire_wait_seconds_sum") / answered * 1000 : (lastMetrics ? 0 : null));
    const ended = delta(m, "lockd_lease_hold_seconds_count");
    push(ops.hold, ended > 0 ? delta(m, "lockd_lease_hold_seconds_sum") / ended : null);
    const granted = total(m, "lockd_lease_ttl_seconds_count");
    push(ops.ttl, granted > 0 ? total(m, "lockd_lease_ttl_seconds_sum") / granted : null);
    push(ops.failures, lastMetrics ? delta(m, "lockd_renewal_failures_total") : 0);
    push(ops.skew, m.has("lockd_store_clock_skew_seconds") ? m.get("lockd_store_clock_skew_seconds") : null);
    lastMetrics = m;
    drawCharts();
  } catch (e) { /* the locks' re-read reports the connection */ }
}
function sampleLocks() {                       // after each re-read of the locks
  for (const [name, l] of locks) {
    const h = lockHistory.get(name) || {waiters: [], holds: []};
    push(h.waiters, l.waiters || 0);
    push(h.holds, null);
    lockHistory.set(name, h);
  }
}
function noteHold(type, ev) {                  // from the event stream: a hold's share of its TTL
  if (type === "acquired") { grants.set(ev.lock, {at: performance.now(), ttl: ev.ttl_ms}); return; }
  const g = grants.get(ev.lock);
  if (!g || !g.ttl) return;
  grants.delete(ev.lock);
  const h = lockHistory.get(ev.lock) || {waiters: [0], holds: [null]};
  h.holds[h.holds.length - 1] = Math.min(1.5, (performance.now() - g.at) / g.ttl);
  lockHistory.set(ev.lock, h);
}
function sparkCell(name) {
  const td = document.createElement("td"); td.className = "spark";
  const c = document.createElement("canvas"); c.width = 240; c.height = 44; td.append(c);
  const h = lockHistory.get(name);
  if (h) drawLines(c, [{values: h.waiters, color: COLORS.a}, {values: h.holds, color: COLORS.b, dots: true}], 1);
  return td;
}
"""
