"""Issue 29: the internal port closed by default, against the real edge and raw HTTP.

Methods other than GET are 405 with or without a body (chunked too); errors are JSON, 414 and 431
included; every request but GET /healthz needs the internal token, also on an edge given none;
a `Host` that is not the internal address is 403 (DNS rebinding); ids are decoded strictly.
Every test here failed on the code before the issue was fixed (the POST with a body got an
empty reply, the foreign Host and the token-less request got 200, the broken encodings were
repaired into other ids)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from edge.server import Edge

from .conftest import INTERNAL_TOKEN, Cluster, Ids, ws_url
from .wsclient import Client, of_type

pytestmark = pytest.mark.integration

AUTH = f"Bearer {INTERNAL_TOKEN}"
ROUTES = [
    "/api/v1/internal/presence/users/u1",
    "/api/v1/internal/presence/online?serverId=g1",
    "/api/v1/internal/presence/focus?userId=u1&channelId=c1",
    "/api/v1/internal/presence/active?hours=1",
    "/api/v1/internal/presence/cluster",
    "/metrics",
]


async def raw(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data` as it is; the answer's status, headers and body (read to the close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head, f"no answer at all to {data[:80]!r}"
    status_line, *lines = head.decode("iso-8859-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return int(status_line.split()[1]), headers, body


async def request(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    host: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None and "Transfer-Encoding" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return await raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))


def error_of(body: bytes) -> str:
    payload: Any = json.loads(body)
    assert isinstance(payload, dict) and isinstance(payload.get("error"), str), body
    return str(payload["error"])


@pytest.mark.parametrize("path", ["/api/v1/internal/presence/users/u1", "/healthz", "/metrics"])
@pytest.mark.parametrize(
    ("method", "headers", "body"),
    [
        ("POST", {"Content-Type": "application/json"}, b"{}"),
        ("POST", {}, b"x" * 100_000),
        ("PUT", {"Transfer-Encoding": "chunked"}, b"2\r\n{}\r\n0\r\n\r\n"),
        ("PATCH", {"Content-Type": "application/json"}, b'{"status": "online"}'),
        ("DELETE", {}, None),
        ("OPTIONS", {}, None),
    ],
)
async def test_every_method_but_get_is_405_with_or_without_a_body(
    edge: Edge, path: str, method: str, headers: dict[str, str], body: bytes | None
) -> None:
    status, answer_headers, answer = await request(
        edge.internal_port, method, path, {**headers, "Authorization": AUTH}, body
    )
    assert status == 405, answer
    assert answer_headers["allow"] == "GET"
    assert answer_headers["content-type"] == "application/json"
    assert error_of(answer)


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/nowhere"])
async def test_head_is_405_without_content(edge: Edge, path: str) -> None:
    """A HEAD answer has no content (RFC 9110): a client reads none after the head, and a second
    answer on its connection would begin with the body's bytes."""
    status, headers, body = await request(edge.internal_port, "HEAD", path, {"Authorization": AUTH})
    assert status == 405 and headers["allow"] == "GET"
    assert body == b""


async def test_a_405_needs_no_token_and_no_route(edge: Edge) -> None:
    status, _, body = await request(edge.internal_port, "POST", "/nowhere", body=b"{}")
    assert status == 405 and error_of(body)


async def test_oversize_heads_are_refused_with_json(edge: Edge) -> None:
    port = edge.internal_port
    status, headers, body = await request(port, "GET", "/api/v1/internal/presence/users/" + "x" * 10_000)
    assert status == 414 and headers["content-type"] == "application/json" and error_of(body)
    status, headers, body = await request(port, "GET", "/healthz", {"X-Big": "y" * 10_000})
    assert status == 431 and headers["content-type"] == "application/json" and error_of(body)
    many = {f"X-H{i}": "1" for i in range(200)}
    status, _, body = await request(port, "GET", "/healthz", many)
    assert status == 431 and error_of(body)
    status, _, body = await raw(port, b"NOT HTTP\r\n\r\n")
    assert status == 400 and error_of(body)


@pytest.mark.parametrize("path", ROUTES)
async def test_every_route_but_healthz_needs_the_token(edge: Edge, path: str) -> None:
    port = edge.internal_port
    status, headers, body = await request(port, "GET", path)
    assert status == 401 and headers["www-authenticate"] == "Bearer" and error_of(body)
    status, _, body = await request(port, "GET", path, {"Authorization": "Bearer not-the-token"})
    assert status == 401, body
    status, _, body = await request(port, "GET", path, {"Authorization": AUTH})
    assert status in (200, 404), body  # users/u1 may not exist
    status, _, _ = await request(port, "GET", "/healthz")
    assert status == 200


async def test_two_authorization_headers_are_401_not_a_dropped_connection(
    edge: Edge, caplog: pytest.LogCaptureFixture
) -> None:
    """Two headers raised inside the parser: no answer at all, and a traceback in the log for
    every such request (a log flood for anyone who reaches the port)."""
    caplog.set_level("ERROR")
    port = edge.internal_port
    head = f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    twice = f"Authorization: {AUTH}\r\nAuthorization: {AUTH}\r\n\r\n"
    status, _, body = await raw(port, (head + twice).encode())
    assert status == 401, body
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.parametrize("route", ["online", "active?hours=24&"])
async def test_a_blank_server_id_is_400_not_the_whole_cluster(edge: Edge, route: str) -> None:
    """`active?serverId=` used to answer the count of every account (the blank value was dropped,
    as if no server had been named)."""
    path = f"/api/v1/internal/presence/{route}{'?' if '?' not in route else ''}serverId="
    status, _, body = await request(edge.internal_port, "GET", path, {"Authorization": AUTH})
    assert status == 400, body


@pytest.fixture
async def tokenless_edge(cluster: Cluster) -> AsyncIterator[Edge]:
    e = Edge(cluster.edge_config(internal_token=None))
    await e.start()
    yield e
    await e.stop()


async def test_an_edge_given_no_token_is_still_closed(tokenless_edge: Edge) -> None:
    port = tokenless_edge.internal_port
    for path in ROUTES:
        status, _, body = await request(port, "GET", path)
        assert status == 401, (path, body)
    assert (await request(port, "GET", "/healthz"))[0] == 200


async def test_healthz_without_a_token_tells_nothing_about_sockets(
    tokenless_edge: Edge, cluster: Cluster, ids: Ids
) -> None:
    """`/healthz` needs no token: its answer must not move when an account connects (an
    invisible one's socket count was a side channel for whoever reaches the port)."""
    port = tokenless_edge.internal_port
    before = (await request(port, "GET", "/healthz"))[2]
    c = await Client.connect(ws_url(tokenless_edge), cluster.token(ids("hidden")))
    await c.request({"type": "presence.update", "status": "invisible"}, of_type("presence.self"))
    after = (await request(port, "GET", "/healthz"))[2]
    assert after == before and b"sockets" not in after
    await c.close()


@pytest.mark.parametrize("path", [*ROUTES, "/healthz", "/admin"])
async def test_a_foreign_host_reads_nothing(edge: Edge, path: str) -> None:
    """DNS rebinding: a page of rebind.attacker.example whose name now points at 127.0.0.1."""
    port = edge.internal_port
    for host in ("rebind.attacker.example", f"rebind.attacker.example:{port}", "127.0.0.1.nip.io"):
        status, _, body = await request(port, "GET", path, {"Authorization": AUTH}, host=host)
        assert status == 403, (host, body)
        assert error_of(body)
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST"):
        status, _, body = await request(port, "GET", "/healthz", host=host)
        assert status == 200, (host, body)
    # Two Host headers: neither is trusted.
    doubled = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n"
    assert (await raw(port, doubled))[0] == 403
    # No Host at all (HAProxy's HTTP/1.0 health check): no browser, so no rebinding page.
    assert (await raw(port, b"GET /healthz HTTP/1.0\r\n\r\n"))[0] == 200


async def test_an_allowed_host_is_served(cluster: Cluster) -> None:
    e = Edge(cluster.edge_config(internal_allowed_hosts=("presence-internal.example",)))
    await e.start()
    try:
        port = e.internal_port
        status, _, body = await request(
            port, "GET", "/metrics", {"Authorization": AUTH}, host="presence-internal.example"
        )
        assert status == 200, body
        status, _, _ = await request(port, "GET", "/metrics", {"Authorization": AUTH}, host="other.example")
        assert status == 403
    finally:
        await e.stop()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/internal/presence/users/ab%ED%A0%80",  # an encoded surrogate
        "/api/v1/internal/presence/users/zz%FF",  # not UTF-8
        "/api/v1/internal/presence/users/zz%FE",
        "/api/v1/internal/presence/users/%C3",  # cut short
        "/api/v1/internal/presence/focus?userId=u%ED%A0%80&channelId=c",
        "/api/v1/internal/presence/focus?userId=u&channelId=c%FF",
        "/api/v1/internal/presence/online?serverId=g%ED%B0%80",
        "/api/v1/internal/presence/active?hours=1&serverId=g%80",
    ],
)
async def test_ids_are_decoded_strictly(edge: Edge, path: str) -> None:
    status, _, body = await request(edge.internal_port, "GET", path, {"Authorization": AUTH})
    assert status == 400, body
    assert "UTF-8" in error_of(body)


async def test_well_encoded_ids_still_work(edge: Edge, ids: Ids) -> None:
    user = ids("zoë")
    encoded = user.replace("ë", "%C3%AB")
    status, _, body = await request(
        edge.internal_port, "GET", f"/api/v1/internal/presence/users/{encoded}", {"Authorization": AUTH}
    )
    assert status == 404 and error_of(body) == "no such account"
    status, _, body = await request(
        edge.internal_port,
        "GET",
        f"/api/v1/internal/presence/focus?userId={encoded}&channelId=c%20d",
        {"Authorization": AUTH},
    )
    assert status == 200 and json.loads(body) == {"focused": False}
