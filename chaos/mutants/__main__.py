"""``python -m chaos.mutants`` (``make mutants``): plant each mutant, run chaos, say if caught.

::

    python -m chaos.mutants [--seconds 40] [--seed 4242] [--only name,name] [--keep]
                            [--workload counter|transfer|sql|rw|sem|election]

``--workload W`` runs the mutants whose ``workloads`` include W, under W (without it, each
mutant under its first workload). Prints one line per mutant, ``<name>: detected, <N>
violations (<kind> <count>, ...)`` (the count is the margin: a mutant caught by one violation is
caught by luck) or ``<name>: UNDETECTED``, then ``undetected: N``. Exit 1 when N > 0 or when a mutant no longer applies (its line says
``NO LONGER APPLIES``, counted as undetected).
"""

from __future__ import annotations

import argparse
import sys
import time

from chaos.mutants import MUTANTS, MutantNoLongerApplies, run_mutant
from chaos.workload import WORKLOADS

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.mutants", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=40.0, help="chaos run per mutant (default 40)")
    p.add_argument("--seed", type=int, default=4242)
    p.add_argument("--only", default="", help="comma-separated mutant names")
    p.add_argument("--keep", action="store_true", help="keep each mutant's tree and logs")
    p.add_argument("--workload", choices=(*WORKLOADS, "objects"), default=None,
                   help="run the mutants that this workload reaches, under it (default: every "
                        "mutant under its first workload; transfer: multi-lock leases and "
                        "batches; sql: plain SQL on the database's fence triggers)")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if (not args.only or m.name in args.only.split(","))
              and (args.workload is None or args.workload in m.workloads)]
    undetected = 0
    started = time.monotonic()
    for mutant in chosen:
        try:
            out = run_mutant(mutant, seconds=args.seconds, seed=args.seed, keep=args.keep,
                             workload=args.workload)
        except MutantNoLongerApplies as exc:
            undetected += 1
            print(f"{mutant.name}: NO LONGER APPLIES ({exc})", flush=True)
            continue
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(out["kinds"].items()))
        if out["detected"]:
            print(f"{mutant.name}: detected, {out['violations']} violations ({kinds}) "
                  f"[{out['elapsed_s']} s]", flush=True)
        else:
            undetected += 1
            print(f"{mutant.name}: UNDETECTED [{out['elapsed_s']} s]", flush=True)
    print(f"{len(chosen)} mutants in {time.monotonic() - started:.0f} s")
    print(f"undetected: {undetected}")
    return 1 if undetected else 0


if __name__ == "__main__":
    sys.exit(main())
