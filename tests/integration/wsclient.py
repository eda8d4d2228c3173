"""A websocket test client that keeps every frame it receives and waits on conditions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from tests.timing import patience

Frame = dict[str, Any]


class Client:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[Frame] = []
        self.log: list[Frame] = []  # everything ever received, for invariant checks
        self.ready: Frame | None = None
        self.close_code: int | None = None
        # Set whenever a frame arrives or the connection ends: `expect` waits on it, not on a clock.
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, token: str, via: str = "identify") -> Client:
        headers = {"Authorization": f"Bearer {token}"} if via == "header" else None
        ws = await websockets.connect(url, additional_headers=headers, open_timeout=patience(10))
        client = cls(ws)
        if via == "identify":
            await client.send({"type": "identify", "token": token})
        client.ready = await client.expect(lambda f: f.get("type") == "ready", timeout=15)
        return client

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self._received(json.loads(message))
                self._arrived.set()
        except websockets.ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self._ended()
            self._arrived.set()

    def _received(self, frame: Frame) -> None:
        """One frame came in (subclasses also note it elsewhere)."""
        self.frames.append(frame)
        self.log.append(frame)

    def _ended(self) -> None:
        """The connection is gone; `close_code` is set."""

    async def send(self, frame: Frame | str | bytes) -> None:
        await self.ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))

    async def expect(self, pred: Callable[[Frame], bool], timeout: float = 5.0) -> Frame:
        """The first frame kept that matches `pred` (removed from `frames`), waiting for it at most
        `patience(timeout)`."""
        timeout = patience(timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._arrived.clear()
            for frame in self.frames:
                if pred(frame):
                    self.frames.remove(frame)
                    return frame
            if self._reader.done():
                raise AssertionError(f"closed ({self.close_code}) while waiting; got {self.frames[-8:]}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching frame within {timeout:.0f} s; got {self.frames[-8:]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def request(self, frame: Frame, pred: Callable[[Frame], bool], timeout: float = 5.0) -> Frame:
        await self.send(frame)
        return await self.expect(pred, timeout)

    async def roundtrip(self) -> None:
        """Everything sent before this has been handled by the edge (frames are handled in order)."""
        await self.request({"type": "heartbeat"}, lambda f: f.get("type") == "heartbeat.ack")

    def about(self, user: str) -> list[Frame]:
        return [
            f
            for f in self.log
            if f.get("userId") == user
            or any(isinstance(u, dict) and u.get("userId") == user for u in f.get("users", []))
        ]

    async def closed(self, timeout: float = 15.0) -> int | None:
        await asyncio.wait_for(asyncio.shield(self._reader), patience(timeout))
        return self.close_code

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.wait_for(asyncio.shield(self._reader), patience(5))


def changed(user: str, status: str) -> Callable[[Frame], bool]:
    return lambda f: (
        f.get("type") == "presence.changed" and f.get("userId") == user and f.get("status") == status
    )


def of_type(kind: str) -> Callable[[Frame], bool]:
    return lambda f: f.get("type") == kind


async def eventually(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Wait until `check()` (sync or async) returns something truthy, at most `patience(timeout)`;
    fail with its last value. `interval` is the polling loop's."""
    timeout = patience(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:.0f} s (last value {value!r})")
        # The polling interval.
        await asyncio.sleep(interval)
