"""Counting semaphores (``service``, ``api``, ``schemas``, ``observe``)."""
