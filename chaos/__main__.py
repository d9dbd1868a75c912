"""``python -m chaos``: run the fault-injection workload and check its history (``make chaos``).

::

    python -m chaos [--store sqlite|postgres|etcd|all] [--seconds 600] [--seed N]
                    [--mode fenced|unfenced-read|nofence|noclaim] [--workers 4] [--resource postgres|sqlite]
                    [--workload counter|transfer|sql|rw|sem|election|objects] [--faults pause,...]
                    [--churn N] [--results-dir chaos/results] [--keep]

Defaults come from ``CHAOS_STORE`` (``all``), ``CHAOS_SECONDS`` (600, per store) and
``CHAOS_SEED`` (random, printed). With ``all`` the stores run one after another, each for the
full duration. Prints a summary per run and writes its JSON report. Exit status 0 when every run
met its expectation (no violation in ``fenced`` mode; at least one in a control mode), else 1.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

from chaos.runner import REPO_ROOT, RunConfig, format_summary, run
from chaos.services import RESOURCES, STORES, VIAS
from chaos.workload import MODES, WORKLOADS

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    p.add_argument("--store", choices=(*STORES, "all"), default=os.environ.get("CHAOS_STORE") or "all")
    p.add_argument("--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS") or 600),
                   help="duration of each store's run (default 600)")
    p.add_argument("--seed", type=int, default=int(os.environ["CHAOS_SEED"])
                   if os.environ.get("CHAOS_SEED") else None)
    p.add_argument("--mode", choices=MODES, default="fenced")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--faults", default="",
                   help="comma-separated fault kinds to inject (default: every kind that applies)")
    p.add_argument("--workload", choices=(*WORKLOADS, "objects"), default="counter",
                   help="what the workers do (default counter)")
    p.add_argument("--resource", choices=RESOURCES, default="postgres",
                   help="the protected database behind the proxy (default postgres)")
    p.add_argument("--via", choices=VIAS, default="proxy",
                   help="what the workers write through: the proxy, a service guarded by "
                        "lockd.guard (guard: chaos.guarded, the counter workload on postgres), "
                        "or the guard's Redis functions (redis-guard: chaos.redisguarded, the "
                        "counter workload in the machine's Redis)")
    p.add_argument("--near", type=float, default=0.1,
                   help="share of operations on neighbour locks, some crossing primitives "
                        "(chaos.near; default 0.1)")
    p.add_argument("--churn", type=int, default=None,
                   help="tasks of background acquire/release churn on locks of their own, so "
                        "that lockd's PostgreSQL batches form (chaos.churn; default 8 on the "
                        "postgres store, else 0)")
    p.add_argument("--results-dir", type=Path, default=REPO_ROOT / "chaos" / "results")
    p.add_argument("--keep", action="store_true", help="keep logs and databases of passing runs")
    return p


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the run: workers, servers, clusters are stopped


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    seed = args.seed if args.seed is not None else random.randrange(1, 1_000_000)
    if args.workload == "objects":  # its own runner: one object, blobs and pointers
        from chaos.objrun import format_objects, run_objects

        print(f"chaos: objects, {args.seconds:g} s, seed {seed} ...", flush=True)
        report = run_objects(seconds=args.seconds, seed=seed, workers=args.workers,
                             resource=args.resource, results_dir=args.results_dir,
                             keep=args.keep,
                             faults=tuple(args.faults.split(",")) if args.faults else None)
        print(format_objects(report), flush=True)
        if report["workdir"]:
            print(f"  logs kept in {report['workdir']}")
        return 0 if report["passed"] else 1
    stores = STORES if args.store == "all" else (args.store,)
    ok = True
    total = args.seconds * len(stores)
    print(f"chaos: {len(stores)} run(s) of {args.seconds:g} s ({', '.join(stores)}): about "
          f"{total / 60:.0f} min of faults plus start-up and checking; a progress line every "
          "30 s", flush=True)
    for store in stores:
        print(f"chaos: store {store}, {args.seconds:g} s, seed {seed}, mode {args.mode} ...",
              flush=True)
        report = run(RunConfig(store=store, seconds=args.seconds, seed=seed, mode=args.mode,
                               workers=args.workers, resource=args.resource,
                               workload=args.workload, via=args.via, near=args.near,
                               churn=(args.churn if args.churn is not None
                                      else 8 if store == "postgres" else 0),
                               kinds=tuple(args.faults.split(",")) if args.faults else None,
                               results_dir=args.results_dir, keep=args.keep,
                               progress=lambda line: print(line, flush=True)))
        print(format_summary(report), flush=True)
        if report["workdir"]:
            print(f"  logs kept in {report['workdir']}")
        ok = ok and report["passed"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
