"""Leader election (``service``, ``api``, ``schemas``, ``observe``)."""
