"""The kit both servers share (lockd's server and ``resource_proxy``); it imports neither.

::

    problems.py     RFC 9457 problem bodies and ProblemError, the base of both error trees
    keys.py         API keys (constant-time comparison) and the identities they grant
    middleware.py   RequestMiddleware: request ids, header bound, bearer keys and cert roles, timing
    responses.py    problem responses and bounded request bodies
    logs.py         log lines (text or JSON) with request ids, every secret-shaped string redacted
    serving/        uvicorn: connection bounds, TLS scope, one send per response, listening
                    sockets, workers, the one Server class (every framework internal is listed there)
    tls.py          TLS start-up checks, server and client contexts, certificate identities
    options.py      the command-line options both servers take alike (bounds, TLS)
    names.py        the lock-name rule (alphabet, length, no empty/./.. segment), name prefixes
    namespace.py    who owns a name: one row per primitive and its reservation, the one check
    fencerule.py    the one rule for which token may write a lock, and the fences every
                    enforcement path checks (the proxy, fenced_transaction)
    keycache.py     lockd's public keys kept fresh for a verifier (fetch, refetch, max age)
    page.py         the shell of both status pages
    apidocs.py      /docs: Swagger UI from packaged files (no CDN), open without a key

``lockd.tokens`` (sign, verify, JWKS) sits beside this package for the same reason. The client
(``lockd.client``) may use ``names``, ``tls``, ``fencerule`` and ``keycache`` too.
"""
