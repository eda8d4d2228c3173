"""The database layer of the tools: schema migration and `presence load`. The shards' batched
reads and writes and the LISTEN side of the audience-change notifications live with the shard
(`actors/pgstore.py`) and are named here too for this module's users.

Every helper is one statement (arrays passed through `unnest`), never one round trip per row, so
a fixture with thousands of members costs a handful of queries. Helpers accept an asyncpg
connection or pool; nothing here knows about Ray.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import asyncpg
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    StrictStr,
    StringConstraints,
    ValidationError,
    model_validator,
)

from actors.core.ids import DEMO_PREFIX, MAX_ID_LENGTH, check_id, is_demo_id
from actors.core.status import LastSeenVisibility

# The shards' reads and writes and the LISTEN side live with the shard (actors/pgstore.py); they
# are named here too for this module's other users (tests, benches, tools).
from actors.pgstore import (  # noqa: F401
    NOTIFY_CHANNEL,
    AccountRow,
    AudienceListener,
    Queryable,
    _affected,
    _columns,
    fetch_accounts,
    fetch_channel_servers,
    fetch_relations,
    last_seen_since,
    read_accounts,
    save_chosen_status,
    save_visibility,
    server_member_ids,
)

log = logging.getLogger(__name__)

SCHEMA_PATH = Path(__file__).with_name("schema.sql")
# Any fixed 64-bit key works; it only has to be the same for every process migrating this database.
MIGRATION_LOCK_KEY = 0x70726573656E6365  # "presence"


@contextlib.asynccontextmanager
async def _connection(target: Queryable | str) -> AsyncIterator[asyncpg.Connection]:
    """One connection from whatever the caller has: a URL (opened and closed here), a pool, or a
    connection (used as is)."""
    if isinstance(target, str):
        conn = await asyncpg.connect(target)
        try:
            yield conn
        finally:
            await conn.close()
    elif isinstance(target, asyncpg.Pool):
        async with target.acquire() as conn:
            yield conn
    else:
        yield target


# -- migration -------------------------------------------------------------------------------------


async def migrate(conn_or_url: Queryable | str) -> None:
    """Apply schema.sql. Idempotent, and safe when several processes do it at once.

    Concurrent `CREATE TABLE IF NOT EXISTS` / `CREATE OR REPLACE FUNCTION` can still fail with
    unique violations in the catalogs, so every migrator first takes one transaction-scoped
    advisory lock: they run one after the other, and each later one finds nothing to do.
    """
    schema = SCHEMA_PATH.read_text()
    async with _connection(conn_or_url) as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await conn.execute(schema)


async def recorded_pool_size(conn_or_url: Queryable | str) -> int | None:
    """The pool's size as `presence scale` last set it (None: never scaled)."""
    async with _connection(conn_or_url) as conn:
        shards = await conn.fetchval("SELECT shards FROM pool_size")
    return None if shards is None else int(shards)


async def record_pool_size(conn_or_url: Queryable | str, shards: int) -> None:
    async with _connection(conn_or_url) as conn:
        await conn.execute(
            "INSERT INTO pool_size (shards) VALUES ($1) "
            "ON CONFLICT (one) DO UPDATE SET shards = EXCLUDED.shards, set_at = now()",
            shards,
        )


# -- presence load ---------------------------------------------------------------------------------

# The id rule (actors/core/ids.py); the length bounds are repeated only for the schema.
Id = Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(check_id)]
Visibility = LastSeenVisibility
Pair = tuple[Id, Id]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixtureUser(_Strict):
    id: Id
    # Absent: an existing account keeps its setting, a new one gets 'everyone'.
    lastSeenVisibility: Visibility | None = None


class FixtureServer(_Strict):
    id: Id
    # Absent: left as it is. Present (even empty): the server's list becomes exactly this.
    members: list[Id] | None = None
    channels: list[Id] | None = None


class Fixture(_Strict):
    """The `presence load` file (protocol.md, "Command line"). Every key is optional."""

    users: list[FixtureUser] = []
    friendships: list[Pair] = []
    removedFriendships: list[Pair] = []
    servers: list[FixtureServer] = []

    @model_validator(mode="after")
    def _consistent(self) -> Fixture:
        """Reject what the database would refuse or what has no single meaning."""
        _no_duplicates("users", [u.id for u in self.users])
        _no_duplicates("servers", [s.id for s in self.servers])
        for key in ("friendships", "removedFriendships"):
            for i, (a, b) in enumerate(getattr(self, key)):
                if a == b:
                    raise ValueError(f"{key}[{i}]: {a!r} cannot be friends with itself")
        both = {_ordered(p) for p in self.friendships} & {_ordered(p) for p in self.removedFriendships}
        if both:
            raise ValueError(f"friendships and removedFriendships both list {sorted(both)[0]}")
        owner: dict[str, str] = {}
        for server in self.servers:
            for channel in server.channels or ():
                if owner.setdefault(channel, server.id) != server.id:
                    raise ValueError(
                        f"servers: channel {channel!r} listed under both {owner[channel]!r} and {server.id!r}"
                    )
        return self


class FixtureError(ValueError):
    """Invalid `presence load` input; the message names the offending field."""


def _no_duplicates(key: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for i, item in enumerate(ids):
        if item in seen:
            raise ValueError(f"{key}[{i}]: duplicate id {item!r}")
        seen.add(item)


def _ordered(pair: tuple[str, str]) -> tuple[str, str]:
    """Friendships are stored once per pair with a < b (the table's CHECK)."""
    a, b = pair
    return (a, b) if a < b else (b, a)


def _demo_entries(fixture: Fixture) -> Iterable[tuple[str, str]]:
    """(where, id) of every id in the fixture, for the reserved-namespace check."""
    for i, u in enumerate(fixture.users):
        yield f"users[{i}].id", u.id
    for key in ("friendships", "removedFriendships"):
        for i, pair in enumerate(getattr(fixture, key)):
            for j, user in enumerate(pair):
                yield f"{key}[{i}][{j}]", user
    for i, server in enumerate(fixture.servers):
        yield f"servers[{i}].id", server.id
        for key in ("members", "channels"):
            for j, item in enumerate(getattr(server, key) or ()):
                yield f"servers[{i}].{key}[{j}]", item


def parse_fixture(data: Mapping[str, Any] | Fixture, allow_demo: bool = False) -> Fixture:
    """Validate `presence load` input; raises FixtureError naming the bad field.

    Ids in the demo's reserved namespace (`demo:…`, actors/core/ids.py) are refused unless
    `allow_demo` (the demo's own accounts, loaded by `presence up`)."""
    fixture = data if isinstance(data, Fixture) else _validated(data)
    if not allow_demo:
        for where, item in _demo_entries(fixture):
            if is_demo_id(item):
                raise FixtureError(
                    f"invalid presence load data: {where}: ids starting with {DEMO_PREFIX!r} "
                    "are reserved for the demo"
                )
    return fixture


def _validated(data: Mapping[str, Any]) -> Fixture:
    try:
        return Fixture.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
            message = err["msg"].removeprefix("Value error, ")
            problems.append(f"{where or '(top level)'}: {message}")
        raise FixtureError("invalid presence load data: " + "; ".join(problems)) from None


async def load_fixture(
    conn: Queryable, data: Mapping[str, Any] | Fixture, allow_demo: bool = False
) -> dict[str, int]:
    """`presence load`: upsert accounts, friendships, servers, members and channels in one
    transaction, and return how many rows really changed.

    Only real changes touch rows, so a second identical run changes nothing and the NOTIFY
    triggers fire only for audiences that actually moved. A listed server's `members` and
    `channels` lists, when present, replace the stored ones; accounts named by friendships or
    member lists that do not exist yet are created with defaults.
    """
    fixture = parse_fixture(data, allow_demo=allow_demo)
    counts = dict.fromkeys(
        (
            "users",
            "friendships_added",
            "friendships_removed",
            "servers_added",
            "members_added",
            "members_removed",
            "channels_upserted",
            "channels_removed",
        ),
        0,
    )
    with_visibility = {u.id: u.lastSeenVisibility for u in fixture.users if u.lastSeenVisibility}
    referenced = {u.id for u in fixture.users}
    for a, b in fixture.friendships:
        referenced.update((a, b))
    for server in fixture.servers:
        referenced.update(server.members or ())
    member_servers = [s.id for s in fixture.servers if s.members is not None]
    members = _columns((s.id, m) for s in fixture.servers for m in s.members or ())
    channel_servers = [s.id for s in fixture.servers if s.channels is not None]
    channels = _columns((c, s.id) for s in fixture.servers for c in s.channels or ())

    async with _connection(conn) as c, c.transaction():

        async def run(sql: str, *arrays: list[str]) -> int:
            # Statements whose first array is empty have nothing to do: skip the round trip.
            return _affected(await c.execute(sql, *arrays)) if arrays[0] else 0

        counts["users"] += await run(
            # Stamped like a choice (schema.sql), so that no older unsaved choice reverts it.
            """INSERT INTO users (id, last_seen_visibility, visibility_at)
               SELECT id, v, now() FROM unnest($1::text[], $2::text[]) AS t(id, v)
               ON CONFLICT (id) DO UPDATE SET last_seen_visibility = EXCLUDED.last_seen_visibility,
                                              visibility_at = EXCLUDED.visibility_at
               WHERE users.last_seen_visibility <> EXCLUDED.last_seen_visibility""",
            *_columns(with_visibility.items()),
        )
        counts["users"] += await run(
            "INSERT INTO users (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            sorted(referenced - with_visibility.keys()),
        )
        counts["friendships_added"] = await run(
            """INSERT INTO friendships (a, b) SELECT * FROM unnest($1::text[], $2::text[])
               ON CONFLICT DO NOTHING""",
            *_columns(_ordered(p) for p in fixture.friendships),
        )
        counts["friendships_removed"] = await run(
            """DELETE FROM friendships f USING unnest($1::text[], $2::text[]) AS r(a, b)
               WHERE f.a = r.a AND f.b = r.b""",
            *_columns(_ordered(p) for p in fixture.removedFriendships),
        )
        counts["servers_added"] = await run(
            "INSERT INTO servers (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            sorted({s.id for s in fixture.servers}),
        )
        counts["members_removed"] = await run(
            """DELETE FROM server_members m
               WHERE m.server_id = ANY($1::text[])
                 AND NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[]) AS w(server_id, user_id)
                                 WHERE w.server_id = m.server_id AND w.user_id = m.user_id)""",
            member_servers,
            *members,
        )
        counts["members_added"] = await run(
            """INSERT INTO server_members (server_id, user_id)
               SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING""",
            *members,
        )
        counts["channels_removed"] = await run(
            """DELETE FROM channels ch
               WHERE ch.server_id = ANY($1::text[])
                 AND NOT EXISTS (SELECT 1 FROM unnest($2::text[]) AS w(id) WHERE w.id = ch.id)""",
            channel_servers,
            channels[0],
        )
        counts["channels_upserted"] = await run(
            """INSERT INTO channels (id, server_id) SELECT * FROM unnest($1::text[], $2::text[])
               ON CONFLICT (id) DO UPDATE SET server_id = EXCLUDED.server_id
               WHERE channels.server_id <> EXCLUDED.server_id""",
            *channels,
        )
    return counts
