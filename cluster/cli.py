"""The `presence` command. Every subcommand takes `--data-dir D` after its own name."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from cluster.config import Settings, load_settings


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return load_settings(data_dir=Path(args.data_dir) if args.data_dir else None, **extra)


def cmd_up(args: argparse.Namespace) -> int:
    from cluster.up import up

    demo = False if args.no_demo else None  # None: the environment's (default on)
    return up(
        _settings(args, shards=args.shards, ws_port=args.ws_port, internal_port=args.internal_port, demo=demo)
    )


def cmd_edge(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args, ws_port=args.ws_port, internal_port=args.internal_port)
    prepare_to_join(settings)
    from cluster.up import edge

    return edge(settings)


def cmd_token(args: argparse.Namespace) -> int:
    from cluster.runtime import token_secret
    from edge.tokens import mint_token

    settings = _settings(args)
    ttl = args.ttl if args.ttl is not None else settings.token_ttl_s
    print(mint_token(args.user, token_secret(settings), ttl_s=ttl))
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    import asyncpg

    from cluster import db
    from cluster.runtime import database_url

    settings = _settings(args)
    try:
        data = json.loads(Path(args.file).read_text())
    except OSError as e:
        print(f"presence load: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"presence load: {args.file} is not valid JSON: {e}", file=sys.stderr)
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
    print("loaded: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args)
    prepare_to_join(settings)
    from cluster.status import status

    return status(settings, as_json=args.json)


def cmd_scale(args: argparse.Namespace) -> int:
    from cluster.runtime import prepare_to_join

    settings = _settings(args)
    prepare_to_join(settings)
    from cluster.scale import scale

    return scale(settings, args.shards)


def cmd_bench(args: argparse.Namespace) -> int:
    from bench.cli import run_bench

    return run_bench(args.rest, _settings(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="presence", description="Presence service on a Ray actor cluster.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
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
    p.add_argument("--ws-port", type=int, default=None)
    p.add_argument("--internal-port", type=int, default=None)
    p.set_defaults(fn=cmd_edge)

    p = add("scale", "resize the actor pool of a running cluster, live")
    p.add_argument("shards", type=int)
    p.set_defaults(fn=cmd_scale)

    p = add("status", "shards, edges, sockets, accounts online, pending last-seen writes")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_status)

    p = add("token", "print a signed token for USER")
    p.add_argument("user")
    p.add_argument("--ttl", type=int, default=None, help="lifetime in seconds (default 86400)")
    p.set_defaults(fn=cmd_token)

    p = add("load", "upsert accounts, friendships, servers, members and channels from a JSON file")
    p.add_argument("file")
    p.set_defaults(fn=cmd_load)

    p = add("bench", "run the benchmarks")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
