"""A few Prometheus counters, kept per app (no globals), rendered as text for ``GET /metrics``."""

from __future__ import annotations

from collections import Counter

__all__ = ["Metrics"]

_HELP = {
    "resource_proxy_requests_total": "Requests answered, by call and HTTP status.",
    "resource_proxy_jwks_loads_total": "JWKS (re)loads attempted.",
}


class Metrics:
    """Counters keyed by (name, sorted labels)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def inc(self, name: str, **labels: str | int) -> None:
        self._counts[(name, tuple(sorted((k, str(v)) for k, v in labels.items())))] += 1

    def render(self, gauges: dict[str, float] | None = None) -> str:
        """Prometheus text exposition; ``gauges`` are added as single samples."""
        lines: list[str] = []
        by_name: dict[str, list[str]] = {}
        for (name, labels), value in sorted(self._counts.items()):
            label_text = ",".join(f'{k}="{v}"' for k, v in labels)
            by_name.setdefault(name, []).append(f"{name}{{{label_text}}} {value}")
        for name, gauge in (gauges or {}).items():
            by_name.setdefault(name, []).append(f"{name} {gauge}")
        for name, samples in by_name.items():
            lines.append(f"# HELP {name} {_HELP.get(name, name)}")
            lines.append(f"# TYPE {name} counter")
            lines.extend(samples)
        return "\n".join(lines) + "\n"
