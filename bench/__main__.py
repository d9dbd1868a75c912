"""``python -m bench`` (``make bench``): run the measurements, print the table, write
``bench/results/latest.json``, ``latest.md`` and ``latest.png``.

Environment:

================  =========  ==========================================================
variable          default    meaning
================  =========  ==========================================================
BENCH_ONLY        1-10       which sections, e.g. ``1,5``
BENCH_SECONDS     2          counted seconds of one round of one measurement
BENCH_ROUNDS      3          rounds (a fresh generator process each); medians over them
BENCH_WARMUP      0.5        uncounted seconds before each round
BENCH_CLIENTS     1,8,32     client counts of section 1
BENCH_PROXY_CLIENTS 8        client counts of sections 5 and 8
BENCH_PROCS       1          generator processes per measurement
BENCH_SCALE_LEASES 100000    held leases in section 6
BENCH_PEERS       (all)      only peers whose name contains one of these words, or is ``=name`` (+ baselines)
BENCH_OUT         bench/results  where the results go
BENCH_HANDOVERS   50         election handovers per row of section 9 (its other knobs: bench/primitives.py)
================  =========  ==========================================================

Needs PostgreSQL (127.0.0.1:5432), Redis (127.0.0.1:6379) and an ``etcd`` binary
(``make system-deps``); a missing one is skipped with a note. The load generator runs in
separate processes from every server; see ``bench/loadgen.py``.

A section that raises is reported (its traceback, and "FAILED" in the results' settings line);
the others still run and are written, and the exit status is 1. A full run takes about 25
minutes on 2 cores.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from bench import chart, goals, report
from bench.scenarios import SCENARIOS, Bench, Settings

__all__ = ["main", "settings_from_env"]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def settings_from_env(env: dict[str, str] | None = None) -> tuple[Settings, list[str]]:
    env = dict(os.environ if env is None else env)
    only = env.get("BENCH_ONLY", "").strip()
    keys = [k.strip() for k in only.split(",") if k.strip()] if only else list(SCENARIOS)
    unknown = [k for k in keys if k not in SCENARIOS]
    if unknown:
        raise SystemExit(f"BENCH_ONLY: unknown section(s) {unknown}; choose from 1-10")
    s = Settings(
        seconds=float(env.get("BENCH_SECONDS", 2)),
        rounds=int(env.get("BENCH_ROUNDS", 3)),
        warmup=float(env.get("BENCH_WARMUP", 0.5)),
        clients=_ints(env.get("BENCH_CLIENTS", "1,8,32")),
        procs=int(env.get("BENCH_PROCS", 1)),
        proxy_clients=_ints(env.get("BENCH_PROXY_CLIENTS", "8")),
        scale_leases=int(env.get("BENCH_SCALE_LEASES", 100_000)),
        peers=tuple(p for p in env.get("BENCH_PEERS", "").split(",") if p.strip()),
    )
    return s, keys


def main() -> int:
    settings, keys = settings_from_env()
    out_dir = Path(os.environ.get("BENCH_OUT", Path(__file__).resolve().parent / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    info = report.machine()
    info["settings"] = (f"sections {','.join(keys)}, {settings.rounds} rounds × "
                        f"{settings.seconds:g} s (+{settings.warmup:g} s warm-up), "
                        f"{settings.procs} generator process(es)")
    print(f"machine: {info['summary']}; load average {info['load_before']}; code "
          f"{info['source']}", flush=True)
    bench = Bench(settings)
    for need, why in bench.skipped.items():
        print(f"note: {need} not available ({why}); its peers are skipped", flush=True)
    sections: list[report.Section] = []
    failed: dict[str, str] = {}
    started = time.monotonic()
    try:
        for key in keys:
            t0 = time.monotonic()
            print(f"[{time.monotonic() - started:5.0f} s] section {key} ...", flush=True)
            fn = SCENARIOS[key]
            if key in ("6", "7") and not bench.has("postgres"):
                store = "sqlite"
            else:
                store = "postgres"
            try:
                if key == "6":
                    section = fn(bench, store)
                elif key == "7":
                    section = fn(bench, store, next((x for x in sections if x.key == "2"), None))
                else:
                    section = fn(bench)
            except Exception as exc:  # the other sections' figures still count: report them
                traceback.print_exc()
                failed[key] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            section.seconds = time.monotonic() - t0
            sections.append(section)
    finally:
        bench.ws.close()
    goal_section = goals.goals(sections)
    if goal_section is not None:
        sections.insert(0, goal_section)
    if failed:
        info["settings"] += "; FAILED: " + "; ".join(f"section {k} ({v})"
                                                      for k, v in failed.items())
    info["load_after"] = report.loadavg()
    info["total_s"] = round(time.monotonic() - started, 1)
    text = report.render_text(sections, info)
    print()
    print(text)
    print(f"total {info['total_s']:.0f} s; load average before {info['load_before']}, "
          f"after {info['load_after']}")
    report.write_json(out_dir / "latest.json", sections, info)
    (out_dir / "latest.md").write_text(report.render_markdown(sections, info))
    why_not = chart.draw(out_dir / "latest.png", sections,
                         f"{info['nproc']} CPU {info['cpu']}, load {info['load_before']}")
    print(f"wrote {out_dir / 'latest.json'}, latest.md"
          + (f" (no chart: {why_not})" if why_not else ", latest.png"))
    if failed:
        print(f"failed sections: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
