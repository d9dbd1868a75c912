"""A Redis 7 fence store: a function library whose functions check and raise a lock's fence
and perform the write in ONE atomic call, so a Redis key is fenced like a row.

Install it once per Redis (``FUNCTION LOAD REPLACE``; idempotent)::

    python -m lockd.guard redis install --redis-url redis://127.0.0.1:6379/0

Then, in the service (``fence`` from ``FenceGuard.check``)::

    fences = RedisFences(redis.Redis())
    fences.set(fence, "orders:42", json.dumps(order), ttl_ms=60_000)   # or hset/delete/xadd

Each function takes ``KEYS = [fence_key, data_key]`` and ``ARGV = [lock, fence, ttl_ms, ...]``:
the fence key (``prefix`` + lock, default prefix ``lockd:fence:``) holds the highest fence
honoured for the lock as a decimal string. A fence below it fails the call with
``STALE lock=L presented=P highest=H`` (``StaleToken``, 409) and nothing is written; otherwise
the highest becomes the fence (equal passes) and the write runs, in the same function call
(Redis runs a function alone: no other command interleaves). Fences are compared as decimal
strings (length, then text), so every 64-bit fence compares exactly (Lua numbers would not).

Functions: ``lockd_fenced_set`` (SET, optional PX), ``lockd_fenced_hset`` (HSET field value ...,
optional PEXPIRE), ``lockd_fenced_del`` (DEL), ``lockd_fenced_xadd`` (XADD id field value ...,
optional PEXPIRE on the stream), ``lockd_fence_claim`` (claim only: claim before a read).
``ttl_ms`` 0 means no expiry. On a Redis Cluster the fence key and the data key must hash to one
slot: give both a hash tag (``prefix="{orders}:fence:"`` and keys ``{orders}:42``).
Redis's own durability applies: a fence raised and lost by a Redis restart without persistence
(no AOF ``appendfsync always``) lets a stale holder back in; say so where you rely on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lockd.common.fencerule import Fence
from lockd.guard.errors import StaleToken

__all__ = ["LIBRARY", "LIBRARY_NAME", "RedisFences", "install"]

LIBRARY_NAME = "lockd_guard"
LIBRARY = r"""#!lua name=lockd_guard

-- a fence is a positive decimal integer without leading zeros: compare length, then text
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- check and raise the fence in KEYS[1]; nil, or an error reply naming the highest
local function claim(keys, args)
  local lock, fence = args[1], args[2]
  if type(fence) ~= 'string' or not string.match(fence, '^[1-9]%d*$') or #fence > 19 then
    return redis.error_reply('ERR lockd_guard: fence must be a positive integer')
  end
  local highest = redis.call('GET', keys[1])
  if highest and below(fence, highest) then
    return redis.error_reply('STALE lock=' .. lock .. ' presented=' .. fence .. ' highest=' .. highest)
  end
  if highest ~= fence then redis.call('SET', keys[1], fence) end
  return nil
end

local function ttl_of(args)
  local ttl = tonumber(args[3] or '0')
  if not ttl or ttl < 0 then return nil end
  return ttl
end

local function rest(args, from)
  local out = {}
  for i = from, #args do out[#out + 1] = args[i] end
  return out
end

redis.register_function('lockd_fence_claim', function(keys, args)
  local refused = claim(keys, args)
  if refused then return refused end
  return redis.call('GET', keys[1])
end)

redis.register_function('lockd_fenced_set', function(keys, args)
  local ttl = ttl_of(args)
  if ttl == nil or args[4] == nil then return redis.error_reply('ERR lockd_guard: bad arguments') end
  local refused = claim(keys, args)
  if refused then return refused end
  if ttl > 0 then return redis.call('SET', keys[2], args[4], 'PX', ttl) end
  return redis.call('SET', keys[2], args[4])
end)

redis.register_function('lockd_fenced_hset', function(keys, args)
  local ttl = ttl_of(args)
  if ttl == nil or #args < 5 or (#args - 3) % 2 ~= 0 then
    return redis.error_reply('ERR lockd_guard: bad arguments')
  end
  local refused = claim(keys, args)
  if refused then return refused end
  local added = redis.call('HSET', keys[2], unpack(rest(args, 4)))
  if ttl > 0 then redis.call('PEXPIRE', keys[2], ttl) end
  return added
end)

redis.register_function('lockd_fenced_del', function(keys, args)
  local refused = claim(keys, args)
  if refused then return refused end
  return redis.call('DEL', keys[2])
end)

redis.register_function('lockd_fenced_xadd', function(keys, args)
  local ttl = ttl_of(args)
  if ttl == nil or #args < 6 or (#args - 4) % 2 ~= 0 then
    return redis.error_reply('ERR lockd_guard: bad arguments')
  end
  local refused = claim(keys, args)
  if refused then return refused end
  local id = redis.call('XADD', keys[2], unpack(rest(args, 4)))
  if ttl > 0 then redis.call('PEXPIRE', keys[2], ttl) end
  return id
end)
"""

_STALE = re.compile(r"STALE lock=(?P<lock>\S+) presented=(?P<presented>\d+) "
                    r"highest=(?P<highest>\d+)")


def install(client: Any) -> str:
    """Load (or replace) the library on ``client`` (a ``redis.Redis``); returns its name."""
    name = client.function_load(LIBRARY, replace=True)
    return name.decode() if isinstance(name, bytes) else str(name)


class RedisFences:
    """Fenced writes to Redis through the ``lockd_guard`` functions (``install`` first).
    ``client``: a ``redis.Redis`` (sync); ``prefix``: of the fence keys (default
    ``lockd:fence:``). Each write raises ``StaleToken`` and writes nothing when stale."""

    def __init__(self, client: Any, prefix: str = "lockd:fence:"):
        self.client = client
        self.prefix = prefix

    def fence_key(self, lock: str) -> str:
        return self.prefix + lock

    def highest(self, lock: str) -> int:
        """The highest fence honoured for ``lock`` (0: none)."""
        value = self.client.get(self.fence_key(lock))
        return int(value) if value is not None else 0

    def _call(self, function: str, fence: Fence, key: str | None, ttl_ms: int | None,
              *args: Any) -> Any:
        fence_key = self.prefix + fence.lock
        try:
            return self.client.fcall(function, 2, fence_key, fence_key if key is None else key,
                                     fence.lock, fence.fence, ttl_ms or 0, *args)
        except Exception as exc:  # redis.exceptions.ResponseError: the function's error reply
            found = _STALE.search(str(exc))
            if found is None:
                raise
            raise StaleToken(found["lock"], int(found["presented"]),
                             int(found["highest"])) from None

    def claim(self, fence: Fence) -> int:
        """Claim ``fence`` without writing (a claim before a read); returns the highest."""
        return int(self._call("lockd_fence_claim", fence, None, None))

    def set(self, fence: Fence, key: str, value: str | bytes, *, ttl_ms: int | None = None) -> Any:
        """SET ``key`` ``value`` (PX ``ttl_ms`` if given) under ``fence``."""
        return self._call("lockd_fenced_set", fence, key, ttl_ms, value)

    def hset(self, fence: Fence, key: str, mapping: Mapping[str, Any], *,
             ttl_ms: int | None = None) -> int:
        """HSET ``key`` with ``mapping`` (then PEXPIRE ``ttl_ms`` if given) under ``fence``."""
        if not mapping:
            raise ValueError("hset needs at least one field")
        pairs = [item for field, value in mapping.items() for item in (field, value)]
        return int(self._call("lockd_fenced_hset", fence, key, ttl_ms, *pairs))

    def delete(self, fence: Fence, key: str) -> int:
        """DEL ``key`` under ``fence``; the number of keys removed."""
        return int(self._call("lockd_fenced_del", fence, key, None))

    def xadd(self, fence: Fence, key: str, fields: Mapping[str, Any], *, id: str = "*",
             ttl_ms: int | None = None) -> str:
        """XADD to stream ``key`` (entry ``id``, default ``*``) under ``fence``; the entry id."""
        if not fields:
            raise ValueError("xadd needs at least one field")
        pairs = [item for field, value in fields.items() for item in (field, value)]
        entry = self._call("lockd_fenced_xadd", fence, key, ttl_ms, id, *pairs)
        return entry.decode() if isinstance(entry, bytes) else str(entry)
