"""The conformance runner of the Python client (``LockClient`` and ``FencedSession``): runs
scenario files of ``conformance/`` (their format: conformance/README.md) against a lockd and a
resource proxy and prints one JSON line per scenario; exit status 0 only if every one passed.

    python -m tests.clients.runner --lockd URL --proxy URL conformance/scenarios/*.json
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from harness import wait_for
from lockd.client import LockClient
from lockd.client.errors import (
    InvalidToken,
    LeaseLostError,
    LimitExceeded,
    LimitMismatch,
    LockClientError,
    LockNotAcquired,
    LockNotAllowed,
    NoLeader,
    NotFoundError,
    OutcomeUnknown,
    PermissionDenied,
    ServiceUnavailable,
    SharedTokenError,
    StaleTokenError,
    TokenRequired,
    ValidationError,
)
from lockd.client.fenced import FencedSession

KINDS: list[tuple[type[Exception], str]] = [
    (LockNotAcquired, "held"), (LeaseLostError, "lease_lost"), (StaleTokenError, "stale_token"),
    (SharedTokenError, "shared_token"), (TokenRequired, "token_required"),
    (InvalidToken, "invalid_token"), (LockNotAllowed, "lock_not_allowed"),
    (LimitMismatch, "limit_mismatch"), (NoLeader, "no_leader"), (PermissionDenied, "forbidden"),
    (NotFoundError, "not_found"), (ValidationError, "invalid_request"),
    (LimitExceeded, "limit_exceeded"), (ServiceUnavailable, "unavailable"),
    (OutcomeUnknown, "outcome_unknown"),
]
"""The language-neutral error kinds (the HTTP contract's problem codes) of the client's errors."""

WHOLE = re.compile(r"^\{([A-Za-z0-9_.]+)\}$")
PART = re.compile(r"\{([A-Za-z0-9_.]+)\}")


class Failed(Exception):
    """A step's outcome differs from its ``expect``."""


def kind_of(exc: Exception) -> str:
    for cls, kind in KINDS:
        if isinstance(exc, cls):
            return kind
    return "protocol_error" if isinstance(exc, LockClientError) else "error"


def substitute(value: Any, env: dict[str, Any]) -> Any:
    """``{name}`` placeholders replaced from ``env``: a string that is one placeholder takes the
    value's own type (a fence stays a number), others are formatted into the string."""
    if isinstance(value, str):
        whole = WHOLE.match(value)
        if whole:
            return env[whole.group(1)]
        return PART.sub(lambda m: str(env[m.group(1)]), value)
    if isinstance(value, list):
        return [substitute(v, env) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, env) for k, v in value.items()}
    return value


def matches(expected: Any, actual: Any) -> bool:
    """``expected`` is a subset of ``actual`` (dicts by key, the rest by equality)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and matches(v, actual[k])
                                                for k, v in expected.items())
    return expected == actual


def check(expect: dict[str, Any], result: dict[str, Any], error: Exception | None) -> None:
    """Raise ``Failed`` unless the outcome is the expected one: the error kind named by
    ``error`` (none: success), then each field (suffixes ``_gt``, ``_ge``, ``_le`` compare)."""
    want = expect.get("error")
    got = kind_of(error) if error is not None else None
    if want != got:
        raise Failed(f"expected {want or 'success'}, got {got or 'success'}"
                     + (f" ({error})" if error is not None else ""))
    for key, value in expect.items():
        if key == "error":
            continue
        for suffix, ok in (("_gt", lambda a, b: a > b), ("_ge", lambda a, b: a >= b),
                           ("_le", lambda a, b: a <= b)):
            if key.endswith(suffix):
                field = key[: -len(suffix)]
                if field not in result or not ok(result[field], value):
                    raise Failed(f"expected {key} {value!r}, got {result.get(field)!r}")
                break
        else:
            if key not in result or not matches(value, result[key]):
                raise Failed(f"expected {key} {value!r}, got {result.get(key)!r}")


class Runner:
    """Runs scenarios with one ``LockClient`` against ``lockd_url`` and ``proxy_url``."""

    def __init__(self, lockd_url: str, proxy_url: str):
        self.client = LockClient(lockd_url, owner="conformance-python")
        self.proxy_url = proxy_url
        self.http = httpx.Client(base_url=proxy_url, timeout=10)

    def run(self, path: Path) -> dict[str, Any]:
        scenario = json.loads(path.read_text())
        env: dict[str, Any] = {"run": f"conf/py-{secrets.token_hex(4)}"}
        base = secrets.randbelow(10**8) * 10
        env.update({f"k{i}": base + i for i in range(1, 10)})
        leases: dict[str, Any] = {}
        sessions: dict[str, FencedSession] = {}
        out = {"scenario": scenario["name"], "client": "python", "ok": True}
        try:
            for index, raw in enumerate(scenario["steps"]):
                step = substitute(raw, env)
                started = time.monotonic()
                result: dict[str, Any] = {}
                error: Exception | None = None
                try:
                    result = self.step(step, leases, sessions) or {}
                except Failed:
                    raise
                except Exception as exc:  # noqa: BLE001 - the step's outcome, checked below
                    error = exc
                    if isinstance(exc, StaleTokenError):
                        result = {"lock": exc.lock, "presented": exc.presented,
                                  "highest": exc.highest}
                result["elapsed_ms"] = (time.monotonic() - started) * 1000
                try:
                    check(step.get("expect", {}), result, error)
                except Failed as exc:
                    raise Failed(f"step {index} ({raw['op']}): {exc}") from None
                if step["op"] == "acquire" and error is None:
                    for field in ("fence", "slot", "lock"):
                        if field in result:
                            env[f"{step['as']}.{field}"] = result[field]
        except Failed as exc:
            out.update(ok=False, failure=str(exc))
        finally:
            for lease in leases.values():
                try:
                    lease.release()
                except Exception:  # noqa: BLE001, S110 - best effort cleanup
                    pass
            for session in sessions.values():
                session.close()
        return out

    def step(self, step: dict[str, Any], leases: dict[str, Any],
             sessions: dict[str, FencedSession]) -> dict[str, Any] | None:
        op = step["op"]
        ttl = step.get("ttl_ms", 0) / 1000
        wait = step.get("wait_ms", 0) / 1000
        renew = step.get("renew", True)
        if op == "acquire":
            if "locks" in step:
                lease = self.client.acquire_many(step["locks"], ttl, wait=wait, auto_renew=renew)
            elif "semaphore" in step:
                lease = self.client.acquire_permit(step["semaphore"], step["limit"], ttl,
                                                   wait=wait, auto_renew=renew)
            elif "election" in step:
                lease = self.client.campaign(step["election"], step.get("value", ""), ttl,
                                             wait=wait, auto_renew=renew)
            else:
                lease = self.client.acquire(step["lock"], ttl, wait=wait, auto_renew=renew,
                                            shared=step.get("shared", False))
            old = leases.pop(step["as"], None)
            if old is not None:
                sessions.pop(step["as"], None)
            leases[step["as"]] = lease
            result = {"lock": lease.lock, "fence": lease.fence,
                      "shared": getattr(lease, "mode", "exclusive") == "shared"}
            if hasattr(lease, "slot"):
                result["slot"] = lease.slot
            if hasattr(lease, "fences"):
                result["locks"] = len(lease.fences)
            return result
        if op == "renew":
            leases[step["lease"]].renew()
            return None
        if op == "release":
            leases[step["lease"]].release()
            return None
        if op in ("sleep", "freeze"):
            time.sleep(step["ms"] / 1000)  # proves: the scenario's own span (its "ms")
            return None
        if op == "wait_lost":
            lease = leases[step["lease"]]
            try:
                wait_for(lease.is_lost, timeout=step["within_ms"] / 1000, interval=0.01,
                         what=f"lease {step['lease']} lost")
            except TimeoutError:
                raise Failed(f"lease {step['lease']} not lost within {step['within_ms']} ms"
                             ) from None
            return {"lost": True}
        if op == "expect_live":
            leases[step["lease"]].check()
            return {"live": True}
        if op == "status":
            status = self.client.status(step["lock"])
            return {"held": status.held, "fence": status.fence, "owner": status.owner}
        if op == "write":
            name = step["lease"]
            if name not in sessions:
                # the write reaches the proxy even when the client knows its lease is lost:
                # the scenario judges the fence (a client may refuse earlier, locally)
                sessions[name] = FencedSession(self.proxy_url, leases[name], refuse_lost=False)
            row = sessions[name].upsert(step["table"], step["key"], step["row"])
            return {"row": row}
        if op == "read":
            response = self.http.get(f"/v1/tables/{step['table']}/rows/{step['key']}")
            response.raise_for_status()
            return {"row": response.json()}
        raise Failed(f"unknown op {op!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lockd", required=True)
    parser.add_argument("--proxy", required=True)
    parser.add_argument("scenarios", nargs="+", type=Path)
    args = parser.parse_args(argv)
    runner = Runner(args.lockd, args.proxy)
    ok = True
    for path in args.scenarios:
        out = runner.run(path)
        ok = ok and out["ok"]
        print(json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
