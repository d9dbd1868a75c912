"""``python -m lockd.guard redis install [--redis-url URL]``: load the guard's Redis function
library (``lockd.guard.redis``), replacing an older version; exit 0 and one line when loaded,
1 with the reason otherwise."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lockd.guard",
                                     description="Install the guard's fence stores.")
    sub = parser.add_subparsers(dest="store", required=True)
    redis_cmd = sub.add_parser("redis", help="the Redis 7 function library")
    redis_sub = redis_cmd.add_subparsers(dest="action", required=True)
    p = redis_sub.add_parser("install", help="FUNCTION LOAD REPLACE the lockd_guard library")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0",
                   help="the Redis to load it into (default redis://127.0.0.1:6379/0)")
    args = parser.parse_args(argv)
    import redis

    from lockd.guard.redis import install

    try:
        with redis.Redis.from_url(args.redis_url) as client:
            name = install(client)
    except redis.RedisError as exc:
        print(f"lockd.guard: cannot load the library into {args.redis_url}: {exc}",
              file=sys.stderr)
        return 1
    print(f"loaded Redis function library {name} into {args.redis_url}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
