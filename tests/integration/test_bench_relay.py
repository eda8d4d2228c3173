"""The relay floor of `bench fanout` (bench/fanout_server.py): the bare broadcast server, once
switched on by SIGUSR1, sends each change through its account's owner process and broadcasts it
on the owner's answer. Real processes, real websockets; a baseline that silently skipped the
owner would measure the bare server twice."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jwt
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from bench import fanout

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SECRET = "relay-test-secret-of-thirty-two-bytes!"


def _start(argv: list[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until it listens, or exits with its error
    m = re.search(r"listening on (\d+)", line)
    if m is None:
        proc.kill()
        pytest.fail(f"{argv} did not start: {line}{proc.stdout.read()}")
    return proc, int(m.group(1))


@pytest.fixture
def relay_servers() -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[str], int]]:
    started: list[subprocess.Popen[str]] = []
    try:
        owner, owner_port = _start(fanout.OWNER_ARGV)
        started.append(owner)
        bare, port = _start(fanout.bare_server_argv(SECRET, [owner_port]))
        started.append(bare)
        yield bare, owner, port
    finally:
        for proc in started:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:  # a failed test left its clients open: no graceful close
                proc.kill()
                proc.wait(5)


async def _identified(port: int, user: str) -> ClientConnection:
    ws = await connect(f"ws://127.0.0.1:{port}/")
    await ws.send(orjson.dumps({"type": "identify", "token": jwt.encode({"sub": user}, SECRET)}).decode())
    assert orjson.loads(await asyncio.wait_for(ws.recv(), 5)) == {"type": "ready"}
    return ws


async def test_once_switched_on_each_change_goes_through_its_owner(
    relay_servers: tuple[subprocess.Popen[str], subprocess.Popen[str], int],
) -> None:
    bare, owner, port = relay_servers
    changer, watcher = await _identified(port, "u1"), await _identified(port, "u2")
    await watcher.send(orjson.dumps({"type": "presence.subscribe", "userIds": ["u1"]}).decode())
    await asyncio.wait_for(watcher.recv(), 5)  # the sync

    async def change(status: str) -> None:
        await changer.send(orjson.dumps({"type": "presence.update", "status": status}).decode())

    async def changed() -> object:
        return orjson.loads(await asyncio.wait_for(watcher.recv(), 5))

    # Before the switch: straight from the bare server, the owner not asked (paused, it cannot answer).
    os.kill(owner.pid, signal.SIGSTOP)
    await change("idle")
    assert await changed() == {"type": "presence.changed", "userId": "u1", "status": "idle"}
    bare.send_signal(signal.SIGUSR1)
    assert bare.stdout is not None
    assert "relay on" in await asyncio.to_thread(bare.stdout.readline)
    # After it: the change waits for the paused owner, and comes once it answers.
    await change("online")
    pending = asyncio.ensure_future(watcher.recv())
    done, _ = await asyncio.wait({pending}, timeout=0.5)
    assert not done, "the change was broadcast without its owner's answer"
    os.kill(owner.pid, signal.SIGCONT)
    assert orjson.loads(await asyncio.wait_for(pending, 5)) == {
        "type": "presence.changed",
        "userId": "u1",
        "status": "online",
    }
    await changer.close()
    await watcher.close()
