"""Issue 14 (secure by default), against the real edge: the id rule where ids arrive, token
lifetimes, the internal API's answers and authentication, and the demo's reach.

Every test here failed on the code before the issue was fixed."""

from __future__ import annotations

import asyncio
import time
import warnings

import jwt
import pytest
import websockets

from edge.server import Edge

from .conftest import SECRET, Cluster, Ids, ws_url
from .wsclient import Client


def _jwt(claims: dict[str, object]) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jwt.encode(claims, SECRET, algorithm="HS256")


async def _close_code(edge: Edge, token: str) -> int | None:
    ws = await websockets.connect(ws_url(edge), additional_headers={"Authorization": f"Bearer {token}"})
    with pytest.raises(websockets.ConnectionClosed):
        while True:  # a ready frame would be read here, then the socket stays open: a timeout
            await asyncio.wait_for(ws.recv(), 5)
    return ws.close_code


# -- the id rule and token limits ---------------------------------------------------------------


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": "lone\ud800surrogate"},  # crashed the handler (1011) before
        {"sub": "zero\u200bwidth"},
        {"sub": "admin\u202e"},  # right-to-left override
        {"sub": "u-far-exp", "exp": 10**300},  # accepted before
        {"sub": "u-no-exp", "exp": None},
        {"sub": "u-week", "exp": "week"},  # replaced below with a week-long exp
    ],
)
async def test_tokens_breaking_the_rules_close_4001(edge: Edge, claims: dict[str, object]) -> None:
    now = int(time.time())
    claims = {"exp": now + 600, **claims}
    if claims["exp"] is None:
        del claims["exp"]
    elif claims["exp"] == "week":
        claims["exp"] = now + 7 * 86_400
    assert await _close_code(edge, _jwt(claims)) == 4001


async def test_ids_breaking_the_rule_in_frames_are_bad_frame(cluster: Cluster, edge: Edge, ids: Ids) -> None:
    c = await Client.connect(ws_url(edge), cluster.token(ids("u")))
    try:
        for frame in (
            {"type": "presence.subscribe", "userIds": ["ok", "zero\u200bwidth"]},
            {"type": "voice.join", "channelId": "spoof\u202eed"},
            {"type": "presence.query", "userIds": ["\ufeffbom"]},
        ):
            answer = await c.request(frame, lambda f: f.get("type") == "error")
            assert answer["code"] == "bad_frame"
        await c.roundtrip()  # still open
    finally:
        await c.close()
