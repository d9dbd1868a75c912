"""Headless Chromium driven over the DevTools protocol (CDP) with ``websockets``: no extra
test dependencies. ``Browser.start(tmp)`` runs Debian's ``chromium`` with a fresh profile and a
free debugging port; ``browser.page()`` opens a tab to ``navigate``, ``evaluate`` JavaScript in,
``wait_for`` a condition and ``screenshot``. ``Browser.start(tmp, trust=[cert_file])`` makes
Chromium accept https servers presenting exactly those certificates' keys (by SPKI hash,
``--ignore-certificate-errors-spki-list``; every other certificate error still fails).
``Browser.start(tmp, offline=True)`` resolves no host name but ``127.0.0.1``/``localhost``: a
page that needs the internet (a CDN) fails to load what it asks for, as on a machine with no
network."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from websockets.sync.client import ClientConnection, connect

from harness import free_port, wait_for

__all__ = ["Browser", "Page", "chromium_path", "spki_hash"]


def spki_hash(cert: Path) -> str:
    """base64(SHA-256(SubjectPublicKeyInfo)) of the first certificate in a PEM file."""
    leaf = x509.load_pem_x509_certificates(Path(cert).read_bytes())[0]
    spki = leaf.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab, talked to over its CDP websocket."""

    def __init__(self, ws: ClientConnection):
        self._ws = ws
        self._ids = itertools.count(1)
        self.console: list[str] = []

    def call(self, method: str, params: dict[str, Any] | None = None,
             timeout: float = 15.0) -> dict[str, Any]:
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            raw = self._ws.recv(timeout=max(0.01, deadline - time.monotonic()))
            msg = json.loads(raw)
            if msg.get("method") == "Runtime.exceptionThrown":
                self.console.append(json.dumps(msg["params"]["exceptionDetails"])[:500])
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error in {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 10.0, what: str = "") -> bool:
        """Poll until ``expression`` is truthy in the page (``TimeoutError`` after ``timeout``)."""
        return wait_for(lambda: self.evaluate(f"Boolean({expression})"), timeout=timeout,
                        interval=0.05, what=f"the page to satisfy {what or expression!r}")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", what="page load")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path


class Browser:
    """A headless Chromium process; ``close()`` ends it."""

    def __init__(self, proc: subprocess.Popen, port: int):
        self.proc, self.port = proc, port
        self._sockets = contextlib.ExitStack()

    @classmethod
    def start(cls, tmp: Path, width: int = 1280, height: int = 800,
              trust: list[Path] = (), offline: bool = False) -> Browser:
        binary = chromium_path()
        assert binary is not None
        port = free_port()
        pins = [f"--ignore-certificate-errors-spki-list={','.join(map(spki_hash, trust))}"] \
            if trust else []
        if offline:
            pins.append("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, "
                        "EXCLUDE localhost")
        proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", *pins,
             "--disable-background-networking", "--no-first-run", "--disable-extensions",
             "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'chromium-profile'}",
             f"--remote-debugging-port={port}", "--remote-allow-origins=*",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        browser = cls(proc, port)

        def answers() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/json/version", timeout=1).status_code == 200:
                    return True
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            return False

        try:
            wait_for(answers, timeout=30, interval=0.1, what="chromium's debugging port")
        except TimeoutError:
            browser.close()
            raise
        return browser

    def page(self) -> Page:
        target = httpx.put(f"http://127.0.0.1:{self.port}/json/new?about:blank", timeout=10).json()
        ws = self._sockets.enter_context(
            connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=10))
        page = Page(ws)
        page.call("Page.enable")
        page.call("Runtime.enable")
        return page

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sockets.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
