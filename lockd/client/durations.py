"""Human durations on the command line: ``"500ms"``, ``"30s"``, ``"2m"``, ``"1h"``, ``"1m30s"``.

lockd's HTTP API speaks integer milliseconds only; these helpers convert what a person types
(``lockctl acquire jobs/x --ttl 30s``) into that, and back for display.

A number without a unit is rejected (except ``"0"``): ``--ttl 30`` could mean seconds or
milliseconds, and guessing wrong by a factor of 1000 is worse than asking.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

__all__ = ["parse_duration", "format_duration"]

_UNIT_MS = {"ms": Decimal(1), "s": Decimal(1000), "m": Decimal(60_000), "h": Decimal(3_600_000)}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h)")


def parse_duration(text: str) -> int:
    """Milliseconds in ``text`` (rounded to the nearest ms).

    Accepts one or more ``<number><unit>`` parts, units ``ms``, ``s``, ``m``, ``h`` (``"1m30s"``,
    ``"1.5s"``); surrounding spaces are ignored. Raises ``ValueError`` for anything else: a
    negative value, a missing unit, an unknown unit.
    """
    if not isinstance(text, str):
        raise ValueError(f"duration must be a string, not {type(text).__name__}")
    s = text.strip().lower()
    if s == "0":
        return 0
    if not s:
        raise ValueError("empty duration")
    total = Decimal(0)
    pos = 0
    while pos < len(s):
        match = _PART.match(s, pos)
        if match is None:
            if re.fullmatch(r"\d+(\.\d+)?", s):
                raise ValueError(f"duration {text!r} needs a unit: ms, s, m or h (e.g. '{s}s')")
            raise ValueError(f"invalid duration {text!r}: expected e.g. 500ms, 30s, 2m, 1h, 1m30s")
        try:
            total += Decimal(match.group(1)) * _UNIT_MS[match.group(2)]
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
            raise ValueError(f"invalid duration {text!r}") from exc
        pos = match.end()
    return int(total.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def format_duration(ms: int) -> str:
    """A short human form of ``ms``: ``250ms``, ``1.5s``, ``2m``, ``1h30m`` (inverse of parse)."""
    if ms < 0:
        return "-" + format_duration(-ms)
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{(Decimal(ms) / 1000).normalize():f}s"
    parts = []
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if rest:
        parts.append(format_duration(rest))
    return "".join(parts)
