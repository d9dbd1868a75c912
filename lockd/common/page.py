"""The shell both status pages share: head, base style, header, API-key prompt and JS helpers.

A page is plain HTML with inline JavaScript and no build step. ``status_page`` wraps a page's own
``<main>`` markup, extra CSS and script in the common shell, which provides to the script:

- ``$(id)``, ``cell(text, cls)`` (a ``<td>``; ``null`` shows as ``-``), ``setConn(ok, text)``;
- ``key`` (the API key, kept in the tab's ``sessionStorage`` under ``storage_key`` only),
  ``headers()`` (``Authorization: Bearer`` when a key is set) and ``askKey()``;
- the key form, which stores the key and calls the page's own ``onKey()``.

The header links to the server's ``/docs`` (Swagger UI) and ``/metrics``, and to any other page
the server names (``links``: the proxy links to its lockd's status page).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["status_page"]

_BASE_CSS = """
  :root { --fg: #1d2329; --muted: #6b7580; --line: #e3e7eb; --bad: #b4490d; --ok: #2c7a3f;
          --bg: #f7f8fa; --accent: #2457a6; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
         color: var(--fg); background: var(--bg); }
  header { display: flex; align-items: baseline; gap: 16px; padding: 14px 24px;
           background: #fff; border-bottom: 1px solid var(--line); }
  header h1 { margin: 0; font-size: 18px; }
  header nav { margin-left: auto; display: flex; gap: 14px; font-size: 13px; }
  header nav a { color: var(--accent); text-decoration: none; }
  header nav a:hover { text-decoration: underline; }
  #conn { color: var(--muted); font-size: 13px; }
  #conn.live::before { content: "\\25CF\\00a0"; color: var(--ok); }
  #conn.down::before { content: "\\25CF\\00a0"; color: var(--bad); }
  main { display: grid; grid-template-columns: %(columns)s; gap: 20px; padding: 20px 24px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; }
  h2 { font-size: 14px; margin: 0 0 8px; color: var(--muted); text-transform: uppercase;
       letter-spacing: .04em; }
  table { width: 100%%; border-collapse: collapse; }
  th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line);
           white-space: nowrap; }
  th { font-weight: 600; color: var(--muted); font-size: 12px; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  td.lock { font-family: ui-monospace, monospace; white-space: normal; word-break: break-all; }
  .empty { color: var(--muted); padding: 10px 0; }
  #auth { display: none; padding: 12px 24px; background: #fff4e5; border-bottom: 1px solid var(--line); }
  #auth input { font: inherit; padding: 3px 6px; width: 22em; }
"""

_BASE_JS = """"use strict";
const $ = (id) => document.getElementById(id);
let key = sessionStorage.getItem(%(storage_key)s) || "";
function headers() { return key ? {"Authorization": "Bearer " + key} : {}; }
function cell(text, cls) {
  const td = document.createElement("td"); td.textContent = text == null ? "-" : String(text);
  if (cls) td.className = cls; return td;
}
function setConn(ok, text) { const c = $("conn"); c.className = ok ? "live" : "down"; c.textContent = text; }
function askKey() { $("auth").style.display = "block"; setConn(false, "API key needed"); }
$("auth").addEventListener("submit", (e) => {
  e.preventDefault(); key = $("key").value.trim(); sessionStorage.setItem(%(storage_key)s, key);
  $("auth").style.display = "none"; onKey();
});
"""


def status_page(*, title: str, who: str, storage_key: str, columns: str, css: str, main: str,
                script: str, links: Sequence[tuple[str, str]] = ()) -> str:
    """One complete HTML page.

    ``title``: the ``<title>`` and the header; ``who``: named in the key prompt ("This lockd needs
    an API key"); ``storage_key``: the ``sessionStorage`` slot of the key; ``columns``: the CSS
    grid columns of ``<main>``; ``css``, ``main``, ``script``: the page's own style, markup inside
    ``<main>`` and script (which must define ``onKey()``); ``links``: (text, URL) pairs shown
    after the page's own ``/docs`` and ``/metrics`` links.
    """
    nav = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a>'
                  for text, href in [("API docs", "/docs"), ("Metrics", "/metrics"), *links])
    base_css = _BASE_CSS % {"columns": columns}
    base_js = _BASE_JS % {"storage_key": '"' + storage_key + '"'}
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{base_css}{css}</style>
</head>
<body>
<header><h1>{title}</h1><span id="conn" class="down">connecting</span>
<span id="summary" style="color: var(--muted)"></span><nav id="links">{nav}</nav></header>
<form id="auth"><label>This {who} needs an API key:
  <input id="key" type="password" autocomplete="off"></label> <button>Use key</button></form>
<main>
{main}
</main>
<script>
{base_js}{script}</script>
</body>
</html>
"""
