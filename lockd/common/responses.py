"""Problem responses and bounded request bodies, as both servers' routes answer and read them.

``problem_response`` and ``error_response`` make the ``application/problem+json`` responses of
``lockd.common.problems``; ``bounded_body`` reads a request body and refuses it past a limit
before or while it is read (nothing beyond the limit is buffered).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.responses import Response

from lockd.common.problems import PROBLEM_JSON, ProblemError, problem_bytes

__all__ = ["bounded_body", "error_response", "problem_response"]


def problem_response(status: int, code: str, title: str, detail: str,
                     extra: dict[str, Any] | None = None,
                     headers: Mapping[str, str] | None = None) -> Response:
    """An ``application/problem+json`` response (see ``lockd.common.problems``)."""
    return Response(problem_bytes(status, code, title, detail, extra), status_code=status,
                    headers=headers, media_type=PROBLEM_JSON)


async def bounded_body(receive_stream: AsyncIterator[bytes], declared: str | None, limit: int,
                       too_large: Callable[[str], Exception]) -> bytes:
    """The whole request body, refused past ``limit`` bytes before or while it is read.

    ``receive_stream``: the body chunks (Starlette's ``request.stream()``); ``declared``: the
    Content-Length header, if any; ``too_large(detail)`` makes the error raised (each server's
    413 ``PayloadTooLarge``). Nothing beyond the limit is buffered.
    """
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in receive_stream:
        size += len(chunk)
        if size > limit:
            raise too_large(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def error_response(error: ProblemError, headers: Mapping[str, str] | None = None) -> Response:
    """The problem response of ``error`` (its status, code, title, detail and extra members)."""
    return problem_response(error.status, error.code, error.title, error.detail, error.extra,
                            headers)
