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
    names.py        the lock-name rule (alphabet, length, no empty/./.. segment)
    page.py         the shell of both status pages
    apidocs.py      /docs: Swagger UI from packaged files (no CDN), open without a key

``lockd.tokens`` (sign, verify, JWKS) sits beside this package for the same reason. The client
(``lockd.client``) may use ``names`` and ``tls`` too.
"""
