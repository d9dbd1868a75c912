"""Locks: single leases in two modes and multi-lock leases (``service``, ``api``, ``schemas``)."""
