"""What every primitive's slice stands on: ``base`` (``Core``, lease ids), ``signer`` (the one
token signer), ``names`` (the one name check), ``waiting`` (the wait queues), ``schemas`` (the
shared body fields), ``http`` (problems, bodies, the guarded route, scope checks), ``answers``
(the lease-answer path) and ``disconnects``. It imports no slice."""
