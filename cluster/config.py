"""The one typed home of configuration.

Every knob has a default that runs the whole service on one machine; environment variables
(`PRESENCE_*`, plus `RAY_ADDRESS`) override it. Commands that need a running service find it
through the data directory's `cluster.json`, written by `presence up`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRESENCE_", extra="ignore")

    # Where the embedded PostgreSQL, Redis and the cluster description live.
    data_dir: Path = Path(".presence")

    # External services; None means "start an embedded one in data_dir".
    database_url: str | None = None
    redis_url: str | None = None
    ray_address: str | None = Field(default=None, validation_alias=AliasChoices("RAY_ADDRESS"))
    ray_namespace: str = "presence"

    # HS256 secret for tokens; None means "generate one and keep it in data_dir/secret".
    token_secret: str | None = None
    token_ttl_s: int = 24 * 3600

    ws_host: str = "0.0.0.0"
    ws_port: int = 8765
    internal_host: str = "127.0.0.1"
    internal_port: int = 8766
    shards: int = 4

    # Protocol timings (the contract fixes 10 s identify and 90 s liveness).
    identify_timeout_s: float = 10.0
    socket_timeout_s: float = 90.0
    heartbeat_interval_ms: int = 30_000
    # How often an edge proves to each shard that it (and so its sockets) is alive: its long-poll
    # for events waits at most this long. Must stay well under socket_timeout_s.
    edge_lease_refresh_s: float = 5.0

    # Per-socket limits.
    max_subscriptions_per_socket: int = 1_000
    max_query_ids: int = 100
    max_frame_bytes: int = 16 * 1024
    # A client whose unread output passes this is disconnected (the connection is aborted).
    send_buffer_bytes: int = 1024 * 1024
    # Per-socket token bucket: a burst of `socket_rate_burst` frames refilled at
    # `socket_rate_per_s`; refused frames get `rate_limited`, and `flood_close_after` of them
    # without the bucket refilling in between close the socket with 1008.
    socket_rate_per_s: float = 20.0
    socket_rate_burst: float = 60.0
    flood_close_after: int = 100

    # Per-edge limits across sockets (more sockets are closed with 4029), and each account's
    # budget of ids named in `presence.query` (a token bucket: this many per minute, burst the
    # same; over budget → `rate_limited`).
    max_sockets_per_account: int = 20
    max_sockets_per_ip: int = 1_000
    query_ids_per_min: float = 600.0
    # Behind a proxy, the header carrying the client's address (e.g. X-Forwarded-For; its last
    # entry counts). Unset: the socket's peer address.
    client_ip_header: str | None = None

    # Edge → shard batching: a batch leaves when it is this old or this large.
    batch_window_ms: float = 2.0
    batch_max_ops: int = 500
    # Shard → edge: after a pull that brought mail, the edge waits this long before the next one,
    # so under load each Ray call carries the mail of several changes (a quiet edge's pending
    # long-poll still answers at once). Each Ray call costs ~1 ms of CPU over both ends.
    pull_gather_ms: float = 0.0

    # Last-seen.
    flush_interval_s: float = 1.0
    flush_max_rows: int = 1_000
    checkpoint_interval_s: float = 600.0
    last_seen_precision_s: int = 60

    # CPython's cycle collector in edges and shards (see actors/gc_policy.py): young collections
    # every gen0 net allocations, gen1 / gen2 as in gc.set_threshold. The defaults keep full
    # collections (which walk every socket's objects) rare; cycles are still collected.
    gc_thresholds: tuple[int, int, int] = (50_000, 50, 100)

    # Typing.
    typing_lapse_s: float = 10.0

    # Cross-shard online counts in Redis: refresh period and how long an entry stays valid.
    count_refresh_s: float = 30.0
    count_ttl_s: float = 90.0

    # `presence up` serves the demo page at / on the websocket port and loads the demo accounts;
    # `presence up --no-demo` (or PRESENCE_DEMO=false) turns both off. `presence edge` never demos.
    demo: bool = True


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit (command-line) values on top."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**clean)  # type: ignore[arg-type]
