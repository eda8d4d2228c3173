"""Held places in Redis, where a restarted shard finds them (protocol.md "Drain and resume").

A socket the server closed for its own reasons keeps its account's place for `resume_s`. That place
lives in the shard's memory; should the shard die during the window, its next incarnation would
know nothing of it: the account shown `offline` to its watchers' resync, then `online` when its
client comes back. So every change of an account's held places is written here, and a shard
starting reads those of its slots back before it serves anything.

    presence:held:<slot>   hash: account → JSON [[closed_at, until, idle], …] (epoch seconds)

One hash per slot (4,096), so a shard reads exactly the slots it owns, whatever resizes moved
them; an account holding nothing any more is deleted from its hash. Entries past their `until`
are ignored when read (the state does that), and each hash expires an hour after its last write.
Redis away: the writes are dropped after a warning and a restarted shard starts with no held
places, as before this store existed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from actors.core.slots import slot_of
from actors.counts import connect

Places = tuple[tuple[float, float, bool], ...]
TTL_S = 3600


def key(slot: int) -> str:
    return f"presence:held:{slot}"


def encode(places: Places) -> bytes:
    return orjson.dumps([list(p) for p in places])


def decode(raw: bytes | str) -> Places:
    return tuple((float(c), float(u), bool(i)) for c, u, i in orjson.loads(raw))


class HeldStore:
    def __init__(self, url: str) -> None:
        self.redis = connect(url)

    async def write(self, changes: Mapping[str, Places]) -> None:
        """Each account's held places as they are now (none: it holds nothing)."""
        pipe = self.redis.pipeline(transaction=False)
        for user_id, places in changes.items():
            k = key(slot_of(user_id))
            if places:
                pipe.hset(k, user_id, encode(places))
                pipe.expire(k, TTL_S)
            else:
                pipe.hdel(k, user_id)
        await pipe.execute()

    async def read(self, slots: Iterable[int]) -> dict[str, Places]:
        """Every account's held places in these slots."""
        pipe = self.redis.pipeline(transaction=False)
        for slot in sorted(slots):
            pipe.hgetall(key(slot))
        out: dict[str, Places] = {}
        for mapping in await pipe.execute():
            for user_id, raw in mapping.items():
                out[user_id.decode() if isinstance(user_id, bytes) else user_id] = decode(raw)
        return out

    async def close(self) -> None:
        await self.redis.aclose()
