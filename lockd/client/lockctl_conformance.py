"""``lockctl conformance``: check that a fenced resource refuses what it must, with real leases.

::

    lockctl [--url LOCKD] conformance TARGET_URL --lock NAME --write 'METHOD PATH [JSON]'
            [--read 'METHOD PATH'] [--restart-cmd 'SHELL COMMAND'] [--restart-wait 30s]

TARGET_URL is the service (a resource proxy, a service guarded by ``lockd.guard``, anything that
follows docs/fencing-protocol.md). Every request carries the token in ``Fencing-Token``. The
checks, in order, each printed ``PASS``/``FAIL`` with what was sent and answered:

1. ``current-holder``: a fresh exclusive lease of NAME writes: 2xx.
2. ``superseded-holder``: that lease is released, a newer one writes (2xx), then the first one
   writes again: 409 (``stale_token``).
3. ``shared-token``: a shared lease of NAME writes: 403.
4. ``other-lock``: a genuine token of another lock (``NAME-conformance-other``): 401 or 403.
5. ``forged-token``: a token signed by a key lockd never published, and a genuine token whose
   fence was raised (its signature no longer matches): 401 or 403 each.
6. ``refusal-persists``: the superseded holder is refused again (409) after ``--restart-cmd``
   ran (a shell command that restarts the service and returns, e.g. ``systemctl restart
   orders``; it may leave the service running in the background; the probe then waits up to
   ``--restart-wait`` for TARGET_URL to answer) or, without it, on a new connection (a service
   that keeps fences per connection, or only in a cache, fails it; only a restart shows a
   service that keeps them in memory).
7. With ``--read`` (a fenced read, e.g. ``GET PATH``): ``read-current`` (the holder's read, 2xx)
   and ``read-superseded`` (the superseded holder's read, 409).

Writes go to the resource for real: point it at a resource you may write. Leases are
released at the end. Exit status: 0 when every check passes; 1 when one fails (the last line
names every failed check); lockd's own errors exit as for any command (69: unavailable).
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from lockd.client.lease import Lease
from lockd.client.lockctl_common import EXIT_ERROR, EXIT_OK, Out, duration
from lockd.tokens import KeyRing

__all__ = ["add_command", "run"]

HEADER = "Fencing-Token"
_TTL_S = 60.0
_TIMEOUT_S = 10.0


def _request(text: str, *, body: bool) -> tuple[str, str, Any]:
    parts = text.strip().split(None, 2)
    if len(parts) < 2 or not parts[1].startswith("/"):
        raise argparse.ArgumentTypeError(f"expected 'METHOD /PATH{' [JSON]' if body else ''}', "
                                         f"got {text!r}")
    payload = None
    if len(parts) == 3:
        if not body:
            raise argparse.ArgumentTypeError(f"a read takes no body: {text!r}")
        try:
            payload = json.loads(parts[2])
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"the body is not JSON ({exc}): {parts[2]!r}") from None
    return parts[0].upper(), parts[1], payload


def add_command(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add ``conformance`` with lockctl's ``add(name, help)``."""
    p = add("conformance", "check that a fenced resource accepts the current holder and refuses "
                           "superseded, shared, other-lock and forged tokens (real leases)")
    p.add_argument("target", metavar="TARGET_URL", help="the service, e.g. http://127.0.0.1:7071")
    p.add_argument("--lock", required=True, help="the lock the write is fenced under")
    p.add_argument("--write", required=True, type=lambda t: _request(t, body=True),
                   help="the write: 'METHOD /PATH [JSON]', e.g. 'PUT /v1/tables/T/rows/1 {\"v\": 1}'")
    p.add_argument("--read", default=None, type=lambda t: _request(t, body=False),
                   help="a fenced read to check too: 'METHOD /PATH'")
    p.add_argument("--restart-cmd", default=None,
                   help="a shell command that restarts the service: refusal is checked after it "
                        "(default: on a new connection)")
    p.add_argument("--restart-wait", type=duration, default=30.0,
                   help="how long the service may take to answer after --restart-cmd (default 30s)")


@dataclass
class _Report:
    out: Out
    checks: list[dict[str, Any]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append({"check": name, "ok": ok, "detail": detail})
        if not self.out.as_json:
            print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
        return ok


def _said(response: httpx.Response | str) -> str:
    if isinstance(response, str):
        return response
    code = ""
    if "json" in response.headers.get("content-type", ""):
        try:
            body = response.json()
            code = f" {body.get('code')}" if isinstance(body, dict) and body.get("code") else ""
        except ValueError:
            pass
    return f"{response.status_code}{code}"


class _Target:
    def __init__(self, url: str, write: tuple[str, str, Any], read: tuple[str, str, Any] | None):
        self.url, self.write_spec, self.read_spec = url.rstrip("/"), write, read
        self.http = httpx.Client(timeout=_TIMEOUT_S)

    def send(self, spec: tuple[str, str, Any], token: str | None,
             http: httpx.Client | None = None) -> httpx.Response | str:
        method, path, body = spec
        headers = {HEADER: token} if token is not None else {}
        try:
            return (http or self.http).request(method, self.url + path, headers=headers,
                                               json=body)
        except httpx.HTTPError as exc:
            return f"no answer ({type(exc).__name__}: {exc})"

    def write(self, token: str, http: httpx.Client | None = None) -> httpx.Response | str:
        return self.send(self.write_spec, token, http)

    def answers(self) -> bool:
        try:
            self.http.get(self.url + "/", timeout=1.0)
            return True
        except httpx.HTTPError:
            return False


def _status(answer: httpx.Response | str) -> int | None:
    return answer.status_code if isinstance(answer, httpx.Response) else None


def _ok(answer: httpx.Response | str) -> bool:
    status = _status(answer)
    return status is not None and 200 <= status < 300


def _raised_fence(token: str) -> str:
    """``token`` with its fence claim raised (the signature no longer matches)."""
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    if "fence" in claims:
        claims["fence"] = int(claims["fence"]) + 1_000_000
    raised = base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode())
    return f"{header}.{raised.rstrip(b'=').decode()}.{signature}"


def run(client: Any, args: argparse.Namespace, out: Out) -> int:
    """Run the checks against ``args.target``; returns the exit status."""
    target = _Target(args.target, args.write, args.read)
    report = _Report(out)
    held: list[Lease] = []
    method, path, _ = args.write
    what = f"{method} {path}"

    def take(name: str, *, shared: bool = False) -> Lease:
        lease = client.acquire(name, _TTL_S, wait=_TTL_S, auto_renew=False, shared=shared)
        held.append(lease)
        return lease

    def release(lease: Lease) -> None:
        client.release(lease)
        held.remove(lease)

    try:
        first = take(args.lock)
        answer = target.write(first.token)
        report.check("current-holder", _ok(answer),
                     f"{what} by the holder (fence {first.fence}): {_said(answer)}, want 2xx")
        if args.read is not None:
            answer = target.send(args.read, first.token)
            report.check("read-current", _ok(answer),
                         f"{args.read[0]} {args.read[1]} by the holder: {_said(answer)}, want 2xx")
        release(first)
        newer = take(args.lock)
        answer = target.write(newer.token)
        if not _ok(answer):
            report.check("superseded-holder", False, f"the newer holder (fence {newer.fence}) "
                         f"could not write: {_said(answer)}, want 2xx")
        else:
            answer = target.write(first.token)
            report.check("superseded-holder", _status(answer) == 409,
                         f"{what} by fence {first.fence} after fence {newer.fence} wrote: "
                         f"{_said(answer)}, want 409")
        if args.read is not None:
            answer = target.send(args.read, first.token)
            report.check("read-superseded", _status(answer) == 409,
                         f"{args.read[0]} {args.read[1]} by fence {first.fence}: "
                         f"{_said(answer)}, want 409")
        release(newer)
        shared = take(args.lock, shared=True)
        answer = target.write(shared.token)
        report.check("shared-token", _status(answer) == 403,
                     f"{what} with a shared lease's token: {_said(answer)}, want 403")
        release(shared)
        other = take(args.lock[:230] + "-conformance-other")
        answer = target.write(other.token)
        report.check("other-lock", _status(answer) in (401, 403),
                     f"{what} with a token of {other.lock}: {_said(answer)}, want 401/403")
        release(other)
        forged = KeyRing.generate().sign(args.lock, 2**62)
        answers = [target.write(forged), target.write(_raised_fence(first.token))]
        report.check("forged-token", all(_status(a) in (401, 403) for a in answers),
                     f"{what} with a token of an unknown key: {_said(answers[0])}, with a "
                     f"tampered fence: {_said(answers[1])}, want 401/403")
        _persists(report, target, first, args, what)
    finally:
        for lease in list(held):
            try:
                client.release(lease)
            except Exception:  # noqa: BLE001 - best effort: the lease expires anyway
                pass
        target.http.close()
    failed = [c["check"] for c in report.checks if not c["ok"]]
    if out.as_json:
        out.emit({"target": args.target, "lock": args.lock, "ok": not failed,
                  "checks": report.checks}, "")
    elif failed:
        print(f"conformance: FAILED {', '.join(failed)} ({len(failed)} of "
              f"{len(report.checks)} checks)")
    else:
        print(f"conformance: all {len(report.checks)} checks passed")
    return EXIT_ERROR if failed else EXIT_OK


def _persists(report: _Report, target: _Target, stale: Lease, args: argparse.Namespace,
              what: str) -> None:
    if args.restart_cmd:
        # output to a file, not a pipe: a command that starts the service in the background
        # leaves it holding its output, and a pipe would be waited on until the service exits
        with tempfile.TemporaryFile() as said:
            try:
                done = subprocess.run(args.restart_cmd, shell=True, stdout=said, stderr=said,
                                      stdin=subprocess.DEVNULL,
                                      timeout=max(60.0, args.restart_wait))
                failed = f"exited {done.returncode}" if done.returncode != 0 else ""
            except subprocess.TimeoutExpired:
                failed = f"did not finish within {max(60.0, args.restart_wait):g}s"
            said.seek(0)
            output = said.read().decode(errors="replace").strip()[-200:]
        if failed:
            report.check("refusal-persists", False, f"--restart-cmd {failed}: {output}")
            return
        deadline = time.monotonic() + args.restart_wait
        while not target.answers():
            if time.monotonic() > deadline:
                report.check("refusal-persists", False, f"the service did not answer within "
                             f"{args.restart_wait:g}s of --restart-cmd")
                return
            time.sleep(0.1)
        answer, where = target.write(stale.token), "after --restart-cmd"
    else:
        with httpx.Client(timeout=_TIMEOUT_S) as fresh:
            answer, where = target.write(stale.token, fresh), "on a new connection"
    report.check("refusal-persists", _status(answer) == 409,
                 f"{what} by fence {stale.fence} {where}: {_said(answer)}, want 409")
