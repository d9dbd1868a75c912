"""The checker of the ``objects`` workload: what was visible, against what was acknowledged.

Inputs: the workers' logs (``chaos.objwork``: ``write``/``ack``/``stale``/``unknown`` with
their tags and fences), the reader's observations (each GET's start and end times, the
``X-Object-Fence``/``X-Object-Version`` headers and the tag in the body) and the blobs left in
the directory against the pointers in the database, at the end.

======================  ==============================================================
``stale_visible``       a read shows a version written under a fence below the highest
                        fence acknowledged before the read began: a superseded holder's
                        write became visible
``torn``                a read's body is not the version its headers name (the body's tag
                        fence is not the pointer's fence): bytes visible outside the
                        transaction that made them the object
``phantom``             a read shows a tag no worker sent
``acked_missing``       a read that began after a write was acknowledged shows an older
                        version: an acknowledged write vanished before a higher fence
                        replaced it
``stale_acked``         a write acknowledged although a higher fence had been acknowledged
                        before it was sent
``orphan_kept``         at the end, a blob no pointer names, written after the last crash
                        of the proxy (so no crash explains it): a refused or replaced
                        version's blob left behind
``orphan_survived``     a blob no pointer names still there after the sweeper's grace
======================  ==============================================================
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["check_objects", "load_log"]


def load_log(paths: Iterable[Path]) -> list[dict[str, Any]]:
    events = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line cut by SIGKILL
    return sorted(events, key=lambda e: e["t"])


def _key(tag: Mapping[str, Any]) -> tuple[int, int, int]:
    return int(tag["w"]), int(tag["fence"]), int(tag["n"])


def check_objects(events: Sequence[Mapping[str, Any]], reads: Sequence[Mapping[str, Any]],
                  orphans_after_crash: Sequence[str], orphans_after_sweep: Sequence[str]
                  ) -> dict[str, Any]:
    """``{violations: [...], violations_by_kind, violation_count, stats}``."""
    violations: list[dict[str, Any]] = []

    def bad(kind: str, detail: str) -> None:
        violations.append({"kind": kind, "detail": detail})

    sent = {_key(e["tag"]): e for e in events if e.get("ev") == "write"}
    acks = [e for e in events if e.get("ev") == "ack"]
    ack_times = [float(e["t"]) for e in acks]
    best: list[int] = []  # the highest fence acknowledged up to each ack
    versions: list[int] = []  # the highest version acknowledged up to each ack
    for e in acks:
        best.append(max(int(e["fence"]), best[-1] if best else 0))
        versions.append(max(int(e["version"]), versions[-1] if versions else 0))

    def before(t: float) -> int:
        """How many acks completed before ``t``."""
        return bisect.bisect_left(ack_times, t)

    for e in acks:  # an ack for a write sent after a higher fence was acknowledged
        i = before(float(sent.get(_key(e["tag"]), e)["t"]))
        if i and best[i - 1] > int(e["fence"]):
            bad("stale_acked", f"write {e['tag']} acknowledged although fence {best[i - 1]} "
                               "had been acknowledged before it was sent")
    for r in reads:
        tag = r.get("tag")
        if tag is None:
            bad("torn", f"a read at {r['start']:.3f} has no tag in its body")
            continue
        if _key(tag) not in sent:
            bad("phantom", f"read at {r['start']:.3f} shows {tag}, which no worker sent")
        if int(tag["fence"]) != int(r["fence"]):
            bad("torn", f"read at {r['start']:.3f}: body of fence {tag['fence']} under a "
                        f"pointer of fence {r['fence']}")
        i = before(float(r["start"]))
        if i and int(tag["fence"]) < best[i - 1]:
            bad("stale_visible", f"read at {r['start']:.3f} shows {tag} (fence {tag['fence']}) "
                                 f"after fence {best[i - 1]} was acknowledged")
        if i and int(r["version"]) < versions[i - 1]:
            bad("acked_missing", f"read at {r['start']:.3f} shows version {r['version']} after "
                                 f"version {versions[i - 1]} was acknowledged")
    for name in orphans_after_crash:
        bad("orphan_kept", f"blob {name} is named by no pointer and was written after the "
                           "proxy's last crash")
    for name in orphans_after_sweep:
        bad("orphan_survived", f"blob {name} is named by no pointer after the sweeper's grace")
    counts = Counter(e.get("ev") for e in events)
    stats = {"attempted": counts["write"], "acknowledged": counts["ack"],
             "stale": counts["stale"], "unknown": counts["unknown"],
             "rejected": counts["rejected"], "acquired": counts["acquired"],
             "reads": len(reads), "highest_acked": best[-1] if best else 0,
             "orphans_after_crash": len(orphans_after_crash),
             "orphans_after_sweep": len(orphans_after_sweep)}
    return {"violations": violations, "violation_count": len(violations),
            "violations_by_kind": dict(Counter(v["kind"] for v in violations)), "stats": stats}
