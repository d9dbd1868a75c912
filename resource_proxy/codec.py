"""JSON in and out, for every resource kind: request bodies parsed with exact Decimals (no
precision lost before a numeric column sees a number), NaN/Infinity refused, and Decimals
written back as exact JSON numbers.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

__all__ = ["loads", "dumps"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(data: bytes | str) -> Any:
    """Parse a request body: floats as Decimal (exact), NaN/Infinity refused (``ValueError``)."""
    return json.loads(data, parse_float=Decimal, parse_constant=_reject_constant)


def dumps(value: Any) -> str:
    """JSON text of ``value``; Decimals become exact JSON numbers (``json`` cannot do that)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except TypeError:  # a Decimal somewhere (json/jsonb values): the exact, slower way
        return _dumps_exact(value)


def _dumps_exact(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(
            json.dumps(str(k), ensure_ascii=False) + ":" + _dumps_exact(v) for k, v in value.items()
        ) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_dumps_exact(v) for v in value) + "]"
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError("NaN and Infinity are not JSON")
        return str(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
