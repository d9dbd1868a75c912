"""A py-spy profile of lockd split by layer: where a lock cycle's CPU goes (not a test).

Reads ``py-spy record --format raw`` output (one collapsed stack per line, then its sample
count) and gives each sample to ONE layer: the first of ``LAYERS`` that any frame of its stack
belongs to, so a JSON encode inside the token signer counts as signing, a psycopg send inside
a route handler counts as the store. What no layer claims (uvloop's own ``run_forever``, task
steps, asyncio's callbacks) is ``event loop``. The SQLite store's worker thread is all
``store``. Used by ``python -m bench.profile_lockd --layers`` and, on a saved raw file::

    python -m bench.layers PROFILE.txt
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

__all__ = ["LAYERS", "by_layer", "format_layers"]

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("token signing", ("lockd/tokens.py", "core/signer.py", "nacl/", "cryptography/", "jwt/")),
    ("body validation", ("pydantic/", "pydantic_core/", "model_validate_json", "read_body",
                         "lockd/server/core/hotbody.py")),
    ("JSON encode", ("json/encoder.py", "json/__init__.py", "orjson", "JSONResponse.render",
                     "lockd/server/core/replies.py")),
    ("store round trip", ("lockd/server/store/", "psycopg/", "psycopg_pool/", "sqlite3/",
                          "Thread.run", "lockd/server/observe.py", "sqlalchemy/")),
    ("service (locks, queues, limits, events, metrics)",
     ("lockd/server/locks/service.py", "core/waiting.py", "core/base.py", "core/answers.py",
      "core/names.py", "lockd/server/limits.py", "lockd/server/events.py",
      "prometheus_client/", "lockd/server/metrics.py")),
    ("HTTP parse, route, respond", ("uvicorn/", "starlette/", "fastapi/", "lockd/common/",
                                    "lockd/server/locks/api.py", "lockd/server/app.py",
                                    "httptools")),
)
"""(layer, substrings of a frame: function name or file path), in claiming order."""

LOOP = "event loop (uvloop, task steps)"


def by_layer(raw: Path) -> tuple[int, collections.Counter[str]]:
    """Total samples of ``raw`` and the samples of each layer (``LOOP`` for the rest)."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        for layer, marks in LAYERS:
            if any(mark in frame for frame in frames for mark in marks):
                counts[layer] += k
                break
        else:
            counts[LOOP] += k
    return total, counts


def format_layers(raw: Path, cpu_ms_per_cycle: float | None = None) -> str:
    """The table of ``by_layer``: share of samples and, given lockd's CPU per cycle (ms), the
    share of it in µs per cycle."""
    total, counts = by_layer(raw)
    out = [f"by layer ({total} samples):"]
    for layer in [name for name, _ in LAYERS] + [LOOP]:
        share = counts[layer] / max(1, total)
        extra = f"  ~{share * cpu_ms_per_cycle * 1000:4.0f} µs/cycle" if cpu_ms_per_cycle else ""
        out.append(f"  {100 * share:5.1f}%  {layer}{extra}")
    return "\n".join(out)


if __name__ == "__main__":
    print(format_layers(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else None))
