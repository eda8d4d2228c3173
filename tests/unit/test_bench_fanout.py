"""bench/fanout.py's pieces that need no servers: the bare broadcast server's command line."""

from __future__ import annotations

import pytest

from bench import fanout, fanout_server


@pytest.mark.parametrize("secret", ["plain_secret", "-starts-with-a-dash", "--looks-like-an-option", "-"])
def test_the_bare_servers_command_line_carries_any_secret(secret: str) -> None:
    """`token_urlsafe` secrets begin with "-" one time in 64; given as a word of its own such a
    secret was read as an option and the server exited at start (a `bench all` run lost its
    fanout so)."""
    argv = fanout.bare_server_argv(secret)
    assert argv[:2] == ["-m", "bench.fanout_server"]
    assert fanout_server.parse(argv[2:]).secret == secret
