"""Fenced objects: the second resource kind, a slice beside the tables over the one fence core.

``names`` (buckets, keys, the lock that governs an object), ``blobs`` (where bodies are stored:
a directory, or an S3-compatible endpoint), ``store`` (the pointer rows, in the proxy's
database, moved in the fence's transaction), ``service`` (the calls, free of HTTP), ``api``
(the routes), ``sweeper`` (orphan blobs). The fence rule, tokens, keys and idempotency are the
tables' (``lockd.common.fencerule``, ``resource_proxy.fencing``, ``resource_proxy.idempotency``).
"""
