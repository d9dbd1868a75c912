"""The kit both servers share (lockd's server and ``resource_proxy``); it imports neither.

::

    problems.py  RFC 9457 problem bodies and ProblemError, the base of both error trees
    httpkit.py   API keys, request ids, header bounds, problem responses, redacting logs
    page.py      the shell of both status pages
    names.py     the lock-name rule (lockd, its client, the proxy's fence routes)
    connections.py  bounds on connections in time and number (uvicorn's protocol, bounded)

``lockd.tokens`` (sign, verify, JWKS) sits beside this package for the same reason.
"""
