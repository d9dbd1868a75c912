"""Fixtures of the hostile-client suite: the lockd and proxy fixtures of their own
suites, re-exported so these tests run against the same real processes."""

from __future__ import annotations

from tests.proxy.conftest import deployment, start_proxy  # noqa: F401
from tests.server.conftest import http, inproc_lockd, lockd_factory, name  # noqa: F401
