"""Statistics and rendering: percentiles, one ``Section`` per scenario, the text table printed at
the end, ``latest.md`` (markdown) and ``latest.json`` (every raw figure).

Conventions: throughput is the MEDIAN over rounds (each round a separate generator process and
a separate window of ``BENCH_SECONDS``); latencies are percentiles over every sample of every
round pooled. Every figure is also given as a ratio to its section's baseline, measured in the
same run (``×`` columns: > 1 means more of that figure than the baseline).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["fmt", "pct", "median", "ratio", "Section", "machine", "render_text", "render_markdown",
           "write_json"]


def pct(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, nearest rank) of ``values``; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


@dataclass
class Section:
    """One scenario's table. ``columns``: (header, format) with format one of ``str``, ``int``,
    ``num`` (3 significant digits), ``ms``, ``mb``, ``x`` (a ratio), ``bool``."""

    key: str
    title: str
    baseline: str
    columns: list[tuple[str, str]]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def fmt(value: Any, kind: str) -> str:
    if value is None:
        return "–"
    if kind == "str":
        return str(value)
    if kind == "bool":
        return "yes" if value else "NO"
    if kind == "int":
        return f"{round(value):,}"
    if kind == "x":
        return f"{value:.2f}×"
    if kind == "mb":
        return f"{value:.1f}"
    if kind in ("ms", "num"):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
        return f"{value:.{digits}f}"
    return str(value)


def _cells(section: Section) -> tuple[list[str], list[list[str]]]:
    headers = [h for h, _ in section.columns]
    rows = [[fmt(v, k) for v, (_, k) in zip(row, section.columns, strict=True)]
            for row in section.rows]
    return headers, rows


def render_text(sections: list[Section], info: dict[str, Any]) -> str:
    out = [f"lockd benchmarks: {info['summary']}; etcd: one member", ""]
    for s in sections:
        headers, rows = _cells(s)
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(headers)]
        out.append(f"{s.key}. {s.title}  (baseline: {s.baseline}; {s.seconds:.0f} s)")
        out.append("  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
        for r in rows:
            out.append("  " + "  ".join(
                (c.ljust(w) if i == 0 else c.rjust(w))
                for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        for note in s.notes:
            out.append(f"  * {note}")
        out.append("")
    return "\n".join(out)


def render_markdown(sections: list[Section], info: dict[str, Any]) -> str:
    out = ["# lockd benchmarks: latest run", "",
           f"Machine: {info['summary']}. Load average before/after the run: "
           f"{info['load_before']} / {info.get('load_after', '?')}. Code: commit "
           f"{info['source']}. Settings: "
           f"{info['settings']}. Produced by `make bench` (see bench/); raw figures in "
           "latest.json.", "",
           "Throughput: median over rounds. Latency: percentiles over all rounds' samples. "
           "`×` columns: ratio to the section's baseline, measured in the same run. etcd is "
           "one member on this same machine (three would triple its CPU and fsyncs on the same "
           "two cores); the load generator is a separate uvloop process.", ""]
    for s in sections:
        headers, rows = _cells(s)
        out.append(f"## {s.key}. {s.title}")
        out.append("")
        out.append(f"Baseline: {s.baseline}.")
        out.append("")
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "|".join("---" if k == "str" else "---:" for _, k in s.columns) + "|")
        for r in rows:
            out.append("| " + " | ".join(r) + " |")
        out.append("")
        for note in s.notes:
            out.append(f"- {note}")
        if s.notes:
            out.append("")
    return "\n".join(out)


def write_json(path: Path, sections: list[Section], info: dict[str, Any]) -> None:
    doc = {"machine": info, "sections": [asdict(s) for s in sections]}
    path.write_text(json.dumps(doc, indent=1, default=str))


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _source() -> str:
    """The commit the measured lockd and proxy come from (``PYTHONPATH`` tree if set)."""
    import lockd

    tree = Path(lockd.__file__).resolve().parents[1]
    commit = _run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"]) or "unknown"
    dirty = _run(["git", "-C", str(tree), "status", "--porcelain", "lockd", "resource_proxy"])
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def machine() -> dict[str, Any]:
    """nproc, CPU model, memory, OS, versions of the peers: what a reader needs to weigh the
    figures."""
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    info = {
        "nproc": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgres": _run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-Atc",
                          "SHOW server_version"]),
        "etcd": (_run(["etcd", "--version"]).splitlines() or [""])[0],
        "redis": _run(["redis-cli", "-h", "127.0.0.1", "INFO", "server"]).split(
            "redis_version:")[-1].split()[0] if _run(["redis-cli", "-h", "127.0.0.1", "PING"])
        else "",
        "load_before": loadavg(),
        "source": _source(),
    }
    info["summary"] = (f"{info['nproc']} CPU ({model}), {info['memory_gib']} GiB RAM, "
                       f"Linux {info['kernel']}, Python {info['python']}, PostgreSQL "
                       f"{info['postgres'] or '?'}, {info['etcd'] or 'etcd ?'}, Redis "
                       f"{info['redis'] or '?'}")
    return info
