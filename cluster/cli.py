"""The `presence` command. Every subcommand takes `--data-dir D` after its own name."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.config import Settings, SettingsError, effective, load_settings, unknown_env_names

SETTINGS_POINTER = (
    "Every setting can also be set from the environment (PRESENCE_<NAME>, RAY_ADDRESS); "
    "`presence config` prints the effective ones, docs/operations.md lists them all."
)


def version() -> str:
    """The installed distribution's version, read at run time from its metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("presence-cluster")
    except PackageNotFoundError:  # pragma: no cover - run from a checkout that was never installed
        return "0+unknown"


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    try:
        settings = load_settings(data_dir=Path(args.data_dir) if args.data_dir else None, **extra)
    except SettingsError as e:
        print(f"presence: bad setting: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from cluster import logs

    logs.configure(settings.log_level, settings.log_json)
    return settings


def warn_unknown_settings() -> None:
    for name, close in unknown_env_names():
        hint = f" (did you mean {close}?)" if close else ""
        print(f"presence: warning: {name} is not a setting and is ignored{hint}", file=sys.stderr)


def cmd_config(args: argparse.Namespace) -> int:
    """What the running service uses: the environment's settings, and for those it leaves unset
    what `presence up` in this data directory chose (its embedded URLs, generated secrets)."""
    from cluster.runtime import running_settings

    used, from_service = running_settings(_settings(args))
    values = effective(used)
    if args.json:
        print(json.dumps({name: v["value"] for name, v in values.items()}, indent=2))
        return 0
    width = max(len(v["env"]) for v in values.values())
    for name, v in values.items():
        origin = "  (running service)" if name in from_service else "" if v["set"] else "  (default)"
        print(f"{v['env']:<{width}}  {json.dumps(v['value'])}{origin}")
    return 0


def _open_files() -> None:
    from cluster.runtime import raise_open_files_limit

    before, after = raise_open_files_limit()
    change = f" (raised from {before})" if after != before else ""
    print(f"presence: open files limit {after}{change}", flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    from cluster import rayauth

    demo = False if args.no_demo else None  # None: the environment's (default on)
    settings = _settings(
        args, shards=args.shards, ws_port=args.ws_port, internal_port=args.internal_port, demo=demo
    )
    _open_files()
    # Before `ray` is imported: a local instance gets token authentication, a cluster to join the
    # mode it requires.
    if settings.ray_address:
        rayauth.prepare_join(settings.ray_address)
    else:
        rayauth.prepare_local()
    from cluster.up import up

    return up(settings)


def cmd_edge(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args, ws_port=args.ws_port, internal_port=args.internal_port)
    _open_files()
    prepare_to_join(settings)
    from cluster.edge_process import edge

    return edge(settings)


def cmd_token(args: argparse.Namespace) -> int:
    from actors.core.ids import is_demo_id
    from cluster.runtime import token_secret
    from edge.tokens import mint_token

    settings = _settings(args)
    ttl = args.ttl if args.ttl is not None else settings.token_ttl_s
    # The lifetime's source, as the operator named it: the flag, or the setting behind the default.
    given = "--ttl" if args.ttl is not None else f"PRESENCE_TOKEN_TTL_S ({ttl})"
    if ttl <= 0:
        print(f"presence token: {given} must be a positive number of seconds", file=sys.stderr)
        return 2
    if ttl > settings.token_max_ttl_s:
        print(
            f"presence token: {given} may be at most {settings.token_max_ttl_s} seconds "
            "(PRESENCE_TOKEN_MAX_TTL_S); edges refuse longer-lived tokens",
            file=sys.stderr,
        )
        return 2
    if is_demo_id(args.user):
        print("presence token: ids starting with 'demo:' belong to the demo site", file=sys.stderr)
        return 2
    try:
        token = mint_token(args.user, token_secret(settings), ttl_s=ttl)
    except ValueError as e:
        print(f"presence token: {e}", file=sys.stderr)
        return 2
    print(token)
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    import asyncpg

    from cluster import db
    from cluster.runtime import database_url

    settings = _settings(args)
    try:
        data = json.loads(Path(args.file).read_text(), object_pairs_hook=_no_repeated_keys)
    except OSError as e:
        print(f"presence load: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"presence load: {args.file} is not valid JSON: {e}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"presence load: {args.file} is nested too deeply to be a graph", file=sys.stderr)
        return 2

    async def run() -> dict[str, int]:
        conn = await asyncpg.connect(database_url(settings))
        try:
            await db.migrate(conn)
            return await db.load_fixture(conn, data)
        finally:
            await conn.close()

    try:
        counts = asyncio.run(run())
    except ValueError as e:
        print(f"presence load: {e}", file=sys.stderr)
        return 2
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        # The database away, or refusing us: one line (it was a traceback), nothing loaded.
        print(
            f"presence load: PostgreSQL did not take the load ({type(e).__name__}: {e}); nothing was loaded",
            file=sys.stderr,
        )
        return 1
    print("loaded: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object naming a key twice: refused (`json` keeps the last one, and the first list
    of, say, `users` was dropped without a word)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def cmd_status(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args)
    prepare_to_join(settings)
    from cluster.status import status

    return status(settings, as_json=args.json)


def cmd_report(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args)
    prepare_to_join(settings)
    from cluster.report import report

    return report(settings, as_json=args.json)


def cmd_scale(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args)
    prepare_to_join(settings)
    from cluster.rollout import rebalance
    from cluster.scale import scale

    return scale(settings, args.shards, rebalance)


def cmd_drain(args: argparse.Namespace) -> int:
    from cluster.drain import drain

    return drain(_settings(args), args.edge, args.wait)


def cmd_rollout(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args)
    prepare_to_join(settings)
    from cluster.rollout import cmd_rollout as run

    return run(settings)


# The benchmarks are a client of the service, not a part of it: bench imports the service, the
# service never imports bench (tests/unit/test_layers.py checks every import statement). The
# `presence` command is only their door: it names the runner as data and loads it when
# `presence bench` runs, so no process of the service (an edge, a shard, `presence up`) ever
# loads bench. Not an entry point: the command must work from a checkout that was installed
# before it existed (`python -m cluster.cli bench`), and every editable install would need
# reinstalling (docs/architecture.md "Layers").
BENCH_RUNNER = ("bench.cli", "run_bench")


def cmd_bench(args: argparse.Namespace) -> int:
    module, name = BENCH_RUNNER
    run_bench: Callable[[list[str], Settings], int] = getattr(importlib.import_module(module), name)
    return run_bench(args.rest, _settings(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="presence", description="Presence service on a Ray actor cluster.", epilog=SETTINGS_POINTER
    )
    parser.add_argument("--version", action="version", version=f"presence {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, epilog=SETTINGS_POINTER)
        p.add_argument(
            "--data-dir", default=None, help="where the service keeps its state (default ./.presence)"
        )
        return p

    p = add("up", "run the whole service on this machine")
    p.add_argument("--shards", type=int, default=None, help="PresenceActor shards (default 4)")
    p.add_argument("--ws-port", type=int, default=None, help="public websocket port (default 8765)")
    p.add_argument("--internal-port", type=int, default=None, help="internal HTTP port (default 8766)")
    p.add_argument(
        "--no-demo", action="store_true", help="no demo page on the websocket port, no demo accounts loaded"
    )
    p.set_defaults(fn=cmd_up)

    p = add("edge", "one more edge process joining a running cluster")
    p.add_argument("--ws-port", type=int, default=None, help="public websocket port (default 8765)")
    p.add_argument("--internal-port", type=int, default=None, help="internal HTTP port (default 8766)")
    p.set_defaults(fn=cmd_edge)

    p = add("scale", "resize the actor pool of a running cluster, live (at its own size: spread it again)")
    p.add_argument("shards", type=int, help="the number of PresenceActor shards to resize to")
    p.set_defaults(fn=cmd_scale)

    p = add(
        "drain",
        "drain one edge: /healthz 503 at once, then its sockets closed with 1012 over a window "
        "(their accounts resume elsewhere without a flicker), then it stops",
    )
    p.add_argument(
        "--edge",
        default=None,
        metavar="URL",
        help="the edge's internal URL, http://HOST:PORT (default: the edge of this data dir)",
    )
    p.add_argument("--wait", action="store_true", help="return once the edge has drained and stopped")
    p.set_defaults(fn=cmd_drain)

    p = add(
        "rollout",
        "replace every actor of the pool with a fresh one running the code installed now, live "
        "(slots moved away and back, one shard at a time; then the FlushActor and the directory)",
    )
    p.set_defaults(fn=cmd_rollout)

    p = add("status", "shards, edges, sockets, accounts online, pending last-seen writes")
    p.add_argument(
        "--json", action="store_true", help="machine-readable output (schema: docs/status.schema.json)"
    )
    p.set_defaults(fn=cmd_status)

    p = add(
        "report",
        "sanity check: last-seen flushed in the last hour and day, newest and oldest stored, "
        "pending writes, active counts",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_report)

    p = add("config", "print the effective settings (secrets redacted) and their environment variables")
    p.add_argument("--json", action="store_true", help="one JSON object, setting name to value")
    p.set_defaults(fn=cmd_config)

    p = add("token", "print a signed token for USER")
    p.add_argument("user", help="the account id the token is for (its `sub`)")
    p.add_argument(
        "--ttl",
        type=int,
        default=None,
        help="lifetime in seconds (default: PRESENCE_TOKEN_TTL_S, 86400; at most PRESENCE_TOKEN_MAX_TTL_S)",
    )
    p.set_defaults(fn=cmd_token)

    p = add("load", "upsert accounts, friendships, servers, members and channels from a JSON file")
    p.add_argument("file", help="the JSON file (format in docs/protocol.md, `presence load`)")
    p.set_defaults(fn=cmd_load)

    p = add("bench", "run the benchmarks")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="NAME [options]; `presence bench help` lists them")
    p.set_defaults(fn=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    warn_unknown_settings()
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # here, where a reader gone is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # The reader went (`presence status | head`): what is left to print goes nowhere, as
        # with any Unix tool, instead of a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
