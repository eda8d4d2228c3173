"""The one typed home of configuration.

Every knob has a default that runs the whole service on one machine; environment variables
(`PRESENCE_*`, plus `RAY_ADDRESS`) override it. Commands that need a running service find it
through the data directory's `cluster.json`, written by `presence up`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "PRESENCE_"
# Settings whose values are secrets: shown as `<redacted>` by `presence config`. URLs in
# REDACTED_URLS keep everything but their password.
SECRET_SETTINGS = frozenset({"token_secret", "internal_token"})
# The shortest token secret taken: the size of HS256's hash (RFC 7518 3.2).
MIN_SECRET_BYTES = 32
REDACTED_URLS = frozenset({"database_url", "redis_url"})
REDACTED = "<redacted>"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRESENCE_", extra="ignore")

    # Where the embedded PostgreSQL, Redis and the cluster description live.
    data_dir: Path = Path(".presence")

    # External services; None means "start an embedded one in data_dir".
    database_url: str | None = None
    redis_url: str | None = None
    ray_address: str | None = Field(default=None, validation_alias=AliasChoices("RAY_ADDRESS"))
    ray_namespace: str = "presence"
    # This node's address as its Ray node knows it (`ray start --node-ip-address`); unset: Ray's
    # guess from the route to the GCS, wrong on a node with several addresses.
    ray_node_ip: str | None = None

    # HS256 secret for tokens; None means "generate one and keep it in data_dir/secret".
    token_secret: str | None = None
    # Lifetime of tokens minted by `presence token` (default), and the longest lifetime an edge
    # accepts: a token whose `exp` lies further ahead than `token_max_ttl_s` is refused with 4001.
    token_ttl_s: int = 24 * 3600
    token_max_ttl_s: int = 24 * 3600

    # Both ports listen on this machine only unless told otherwise (protocol.md "Safe defaults").
    ws_host: str = "127.0.0.1"
    # 0: a free port, chosen when listening. Past 65535 a port was taken modulo 65536, silently.
    ws_port: int = Field(default=8765, ge=0, le=65535)
    internal_host: str = "127.0.0.1"
    internal_port: int = Field(default=8766, ge=0, le=65535)
    # Bearer token every internal API request but GET /healthz must carry (401 otherwise). Unset:
    # `presence up` generates one into `<data_dir>/internal-token` (0600), which our commands,
    # pages and `presence edge` read; an edge whose internal host is not a loopback address
    # refuses to start without one set here.
    internal_token: str | None = None
    # More `Host` names the internal API answers, comma-separated (e.g. the name Prometheus or a
    # balancer uses for it). Besides these only its own address (and `localhost` on loopback):
    # any other Host is 403, so no web page can reach it through DNS rebinding.
    internal_allowed_hosts: str | None = None
    shards: int = Field(default=4, ge=1)
    # Placement (docs/architecture.md "Placement"): `presence up` joining a cluster waits until
    # this many nodes may carry shards (0: 1 + the worker_ips of ~/ray_bootstrap_config.yaml,
    # which `ray up` writes on the head; without it, no wait), at most placement_wait_s.
    shard_nodes: int = 0
    placement_wait_s: float = 180.0
    # Losing Ray (docs/operations.md "The head dies"): `presence edge` gives up joining Ray after
    # ray_join_timeout_s (its supervisor starts it again); an edge whose node's raylet has not
    # answered for ray_lost_s exits, and one that could not reach most of the shards for
    # cut_off_s (its node cut off) drains its sockets (1012) and exits.
    ray_join_timeout_s: float = 120.0
    ray_lost_s: float = 5.0
    cut_off_s: float = 15.0

    # Protocol timings (the contract fixes 10 s identify and 90 s liveness).
    identify_timeout_s: float = 10.0
    socket_timeout_s: float = 90.0
    heartbeat_interval_ms: int = 30_000
    # How often an edge proves to each shard that it (and so its sockets) is alive: its long-poll
    # for events waits at most this long. Must stay well under socket_timeout_s.
    edge_lease_refresh_s: float = 5.0

    # Drain and resume (protocol.md): a socket the server closed for its own reasons (an edge
    # draining: 1012; a shard out of reach: 1011) keeps its account's presence this long, so a
    # client that reconnects meanwhile, on any edge, shows its watchers nothing.
    resume_s: float = Field(default=15.0, ge=0.0)
    # An edge told to drain (SIGTERM, `presence drain`) answers /healthz 503 at once and keeps
    # accepting for `drain_grace_s` (about two health-check intervals of the balancer), then
    # closes its sockets with 1012 spread evenly over `drain_window_s`, then stops.
    drain_grace_s: float = Field(default=4.0, ge=0.0)
    drain_window_s: float = Field(default=10.0, ge=0.0)

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

    # Per-edge limits across sockets (more sockets are closed with 4029).
    max_sockets_per_account: int = 20
    max_sockets_per_ip: int = 1_000
    # Per client address on each edge: connections still upgrading or authenticating at once,
    # and new connections (a token bucket); past either a new connection is dropped at once.
    max_handshakes_per_ip: int = 100
    accepts_per_ip_per_s: float = 100.0
    accepts_per_ip_burst: float = 1_000.0
    # Per edge, over all addresses (edge/opening.py): connections being opened (upgraded and
    # authenticated) at once; past it a new connection waits its turn unread, at most
    # `max_opening_queued` of them and for at most `opening_queue_s`, else it is dropped (its
    # client retries with its backoff). Keeps a reconnect storm from starving open sockets.
    # The places move between `min_opening` and `max_opening` (edge/opening.py `OpeningPace`):
    # they grow while connections wait and the edge's event loop runs at most `opening_lag_ms`
    # late, and halve when it runs later. `min_opening` equal to `max_opening`: a fixed number.
    max_opening: int = Field(default=128, ge=1)
    min_opening: int = Field(default=16, ge=1)
    opening_lag_ms: float = Field(default=20.0, gt=0)
    max_opening_queued: int = Field(default=4_096, ge=0)
    opening_queue_s: float = Field(default=5.0, ge=0)
    # The places of the gate are shared between addresses: while a connection from an address
    # holding fewer than `opening_share_per_ip` waits, an address holding more gives up a place
    # it has held idle (no identify sent) for `opening_idle_evict_s`; freed places go to addresses
    # under their share first. 0 turns the rule off. Behind a proxy (`client_ip_header`) the gate
    # sees one address, and the rule does nothing.
    opening_share_per_ip: int = Field(default=16, ge=0)
    opening_idle_evict_s: float = Field(default=2.0, ge=0)
    # The public port's listen backlog: connections the kernel completes before the edge accepts
    # them (capped by net.core.somaxconn). In a reconnect storm websockets' default, 100,
    # overflows (a client whose handshake the kernel dropped waits out its whole try, 10 s); 1,024
    # made the storm 1.3x the bare server once, but with the opening gate full it stalled
    # identifies for 5 s at a time (cause not found yet), so the default stays 100.
    listen_backlog: int = Field(default=100, ge=1)

    # Per-account budgets, kept by the account's shard so they hold across reconnects and edges
    # (over budget → `rate_limited`). Ids looked up: named in `presence.query` or newly watched
    # through `presence.subscribe` (a token bucket: this many per minute, this burst; the burst
    # is never below max_subscriptions_per_socket). Voice joins that change a roster (kept by
    # the channel's shard). Status changes reach watchers at most 5 times a second (contract).
    query_ids_per_min: float = 1_200.0
    query_ids_burst: float = 2_000.0
    voice_joins_per_min: float = 30.0
    voice_joins_burst: float = 10.0
    # Behind a proxy, the header carrying the client's address (e.g. X-Forwarded-For; its last
    # entry counts). Unset: the socket's peer address.
    client_ip_header: str | None = None

    # Edge → shard batching: a batch leaves when it is this old or this large; when no call to
    # its shard is in flight, when it is `batch_idle_window_ms` old (Nagle's rule: an idle line
    # has nothing to wait for but the other pieces of the same frame's work).
    batch_window_ms: float = 2.0
    batch_idle_window_ms: float = Field(default=0.2, ge=0.0)
    # A busy line (calls in flight) holding only sockets' `connect`s waits this long and not for
    # a call to come back: a reconnect storm's connects leave in fewer, larger batches. 0: off.
    batch_connect_window_ms: float = Field(default=20.0, ge=0.0)
    batch_max_ops: int = 500
    # At most this many batches per shard in flight from one edge; more wait and leave together.
    batch_max_in_flight: int = Field(default=2, ge=1)
    # The road of the edges' batches and long-polls to the shards (actors/lane.py): "direct", one
    # TCP connection per edge and shard (~0.1 ms of CPU a call), or "ray", a Ray actor call each
    # (~1.5 ms). Either way Ray places, restarts and finds the shards.
    shard_lane: Literal["direct", "ray"] = "direct"
    # Where each shard's direct lane listens. Unset: 127.0.0.1 when this process starts its own
    # local Ray (`presence up` without RAY_ADDRESS), else the address of the shard's Ray node
    # (the edges of other nodes must reach it; only callers Ray admits learn its secret).
    shard_lane_host: str | None = None
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
    # collections (which walk every socket's objects) rare; cycles are still collected. A middle
    # collection walks what survived the young ones since the last: 0.44 s in a shard of a million
    # watched members at 50; (50_000, 5, 1_000) made it 80 ms there but lengthened the fan-out's
    # tail in a reconnect storm (bench/profiles/README.md, "The sweep and the collector at a
    # million members").
    gc_thresholds: tuple[int, int, int] = (50_000, 50, 100)

    # Typing.
    typing_lapse_s: float = 10.0

    # Cross-shard online counts in Redis: refresh period and how long an entry stays valid.
    count_refresh_s: float = 30.0
    count_ttl_s: float = 90.0

    # Logs of every process (edges, shards, FlushActor): level, and one JSON object a line.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "WARNING"
    log_json: bool = False

    @field_validator("token_secret")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        # RFC 7518 3.2: an HS256 key MUST be at least as long as the hash. A shorter one can be
        # searched for offline from any one token, and then signs tokens for every account.
        if value and len(value.encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"an HS256 secret needs at least {MIN_SECRET_BYTES} bytes (RFC 7518 3.2), this one "
                f"has {len(value.encode())}; make one with: "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    # `presence up` serves the demo page at / on the websocket port and loads the demo accounts
    # (reserved `demo:` ids), but only with a loopback ws_host and the embedded database;
    # `presence up --no-demo` (or PRESENCE_DEMO=false) turns both off. `presence edge` never demos.
    demo: bool = True


class SettingsError(ValueError):
    """A setting with a value it cannot take; the message is one line naming the variable."""


def allowed_hosts(settings: Settings) -> tuple[str, ...]:
    """`internal_allowed_hosts` as a tuple of names."""
    given = settings.internal_allowed_hosts or ""
    return tuple(h.strip() for h in given.split(",") if h.strip())


def env_name(field: str) -> str:
    """The environment variable that sets `field` (`PRESENCE_SHARDS`, `RAY_ADDRESS`)."""
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    if isinstance(alias, str):
        return alias
    return f"{ENV_PREFIX}{field}".upper()


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit (command-line) values on top.

    A value a setting cannot take raises `SettingsError` with one line per bad setting, naming
    its environment variable, instead of pydantic's report.
    """
    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**clean)  # type: ignore[arg-type]
    except ValidationError as e:
        raise SettingsError(_describe(e, set(clean))) from None


def _describe(error: ValidationError, from_flags: set[str]) -> str:
    lines = []
    for item in error.errors():
        loc = item.get("loc") or ("?",)
        field = str(loc[0])
        where = f"--{field.replace('_', '-')}" if field in from_flags else _where(field)
        value = item.get("input")
        shown = REDACTED if field in SECRET_SETTINGS else repr(value)
        lines.append(f"{where}={shown}: {item.get('msg', 'invalid value')}")
    return "; ".join(lines)


def _where(field: str) -> str:
    return env_name(field) if field in Settings.model_fields else field


def unknown_env_names(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """`PRESENCE_*` variables that name no setting, each with the closest setting's variable."""
    env = os.environ if environ is None else environ
    known = {env_name(f) for f in Settings.model_fields}
    fields = sorted(f.upper() for f in Settings.model_fields)
    unknown = []
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in known:
            continue
        close = difflib.get_close_matches(name.upper()[len(ENV_PREFIX) :], fields, n=1, cutoff=0.8)
        unknown.append((name, ENV_PREFIX + close[0] if close else None))
    return unknown


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by `<redacted>`."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if parts.port is not None:  # raises for a port that is no number, or out of range
            host = f"{host}:{parts.port}"
    except ValueError:
        return REDACTED  # not a URL to show a part of (a traceback once, for a bad port)
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


def effective(settings: Settings) -> dict[str, dict[str, Any]]:
    """Every setting with its value (secrets redacted), variable and whether it was set."""
    explicit = settings.model_fields_set
    out: dict[str, dict[str, Any]] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if name in SECRET_SETTINGS and value is not None:
            value = REDACTED
        elif name in REDACTED_URLS and isinstance(value, str):
            value = redact_url(value)
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = {"value": value, "env": env_name(name), "set": name in explicit}
    return out
