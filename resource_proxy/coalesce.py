"""Moved to ``lockd.common.coalesce`` (shared by lockd and the proxy); re-exported here."""

from lockd.common.coalesce import coalescing_protocol

__all__ = ["coalescing_protocol"]
