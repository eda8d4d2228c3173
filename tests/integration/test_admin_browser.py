"""The operator page (/admin on the internal port) in Debian's Chromium against a real cluster:
the token is asked for once and kept for the tab, an account shows its real status, exact stored
last-seen beside its visibility setting, chosen status and live sockets with their edges, idle
flags and focus; the cluster panel and the active counts fill in. Takes a screenshot: into
docs/admin.png with UPDATE_SCREENSHOTS=1 (how the one in the docs was made), else into the
test's temporary directory, so a test run leaves the work tree clean."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from edge.server import Edge

from .conftest import Cluster, Ids, load
from .test_demo_browser import NO_BROWSER, WAIT_MS, browser, http_get  # noqa: F401 (fixture)
from .test_presence_ws import connect
from .wsclient import of_type

pytestmark = pytest.mark.integration

TOKEN = "operator-token-for-the-admin-page-test"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "admin.png"


@pytest.fixture(scope="module")
async def guarded_edge(cluster: Cluster) -> AsyncIterator[Edge]:
    e = Edge(cluster.edge_config(internal_token=TOKEN))
    await e.start()
    yield e
    await e.stop()


async def test_page_files_are_open_and_data_is_not(guarded_edge: Edge) -> None:
    port = guarded_edge.internal_port
    status, headers, body = await http_get(port, "/admin")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"/admin/admin.js" in body and headers["x-frame-options"] == "DENY"
    for path in ("/admin/admin.js", "/admin/admin.css"):
        status, _, _ = await http_get(port, path)
        assert status == 200, path
    for path in ("/api/v1/internal/presence/cluster", "/api/v1/internal/presence/active?hours=1"):
        status, _, body = await http_get(port, path)
        assert status == 401 and "token" in json.loads(body)["error"], path
    status, _, _ = await http_get(port, "/admin/../secret")
    assert status in (401, 404)


def get_with_token(port: int, path: str) -> tuple[int, Any]:
    """Blocking: call it off the event loop (the edge serving it runs on that loop)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


async def test_operator_page(
    cluster: Cluster,
    guarded_edge: Edge,
    edge: Edge,
    conn: asyncpg.Connection,
    ids: Ids,
    browser: Any,  # noqa: F811 (the demo tests' fixture)
    tmp_path: Path,
) -> None:
    from playwright.async_api import expect

    ada = ids("ada")
    await load(conn, {"users": [{"id": ada, "lastSeenVisibility": "nobody"}]})
    one = await connect(cluster, guarded_edge, ada)
    two = await connect(cluster, edge, ada)  # a second socket on another edge
    await one.send({"type": "presence.update", "status": "idle"})
    await two.send({"type": "focus", "channelId": "c-general"})
    await two.send({"type": "presence.update", "status": "invisible"})
    await two.request({"type": "presence.query", "userIds": [ada]}, of_type("presence.changed"))
    await one.request({"type": "presence.query", "userIds": [ada]}, of_type("presence.changed"))

    errors: list[str] = []
    page = await browser.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.set_viewport_size({"width": 1200, "height": 760})
    await page.goto(f"http://127.0.0.1:{guarded_edge.internal_port}/admin")

    # Asked once for the token; a wrong one is refused and asked again.
    await expect(page.get_by_test_id("token-form")).to_be_visible(timeout=WAIT_MS)
    await page.get_by_test_id("token-input").fill("wrong")
    await page.get_by_test_id("token-submit").click()
    await expect(page.get_by_test_id("token-error")).to_be_visible(timeout=WAIT_MS)
    await page.get_by_test_id("token-input").fill(TOKEN)
    await page.get_by_test_id("token-submit").click()
    await expect(page.get_by_test_id("state")).to_have_attribute("data-state", "ok", timeout=WAIT_MS)
    assert await page.evaluate("() => sessionStorage.getItem('presence.internalToken')") == TOKEN

    # The cluster panel: every shard with its slots, both edges, health, counts.
    shards = page.get_by_test_id("shards").locator("tr")
    await expect(shards.first).to_be_visible(timeout=WAIT_MS)
    n = await shards.count()
    slots = [int((await shards.nth(i).locator("td").nth(2).text_content()) or 0) for i in range(n)]
    assert sum(slots) == 4096, slots
    await expect(page.get_by_test_id(f"edge-{guarded_edge.edge_id}")).to_be_visible()
    await expect(page.get_by_test_id(f"edge-{edge.edge_id}")).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_test_id("health-postgres")).to_have_text("ok")
    await expect(page.get_by_test_id("health-redis")).to_have_text("ok")
    await expect(page.get_by_test_id("active-1h")).to_have_text(re.compile(r"^[1-9][\d,]*$"))

    # One account: the real status (invisible), the exact time beside the setting, both sockets.
    await page.get_by_test_id("search-input").fill(ada)
    await page.get_by_test_id("search-button").click()
    await expect(page.get_by_test_id("user-status")).to_have_text("invisible", timeout=WAIT_MS)
    await expect(page.get_by_test_id("user-chosen")).to_have_text("invisible")
    await expect(page.get_by_test_id("user-visibility")).to_have_text("nobody")
    status, view = await asyncio.to_thread(
        get_with_token, guarded_edge.internal_port, f"/api/v1/internal/presence/users/{ada}"
    )
    assert status == 200 and view["lastSeenAt"] is not None
    await expect(page.get_by_test_id("user-last-seen")).to_have_text(view["lastSeenAt"])  # exact, ms
    rows = page.get_by_test_id("user-sockets").locator("tr")
    await expect(rows).to_have_count(2)
    by_socket = {s["socketId"]: s for s in view["liveSockets"]}
    assert {s["edgeId"] for s in by_socket.values()} == {guarded_edge.edge_id, edge.edge_id}
    for socket_id, s in by_socket.items():
        row = page.get_by_test_id(f"socket-{socket_id}")
        await expect(row).to_contain_text(s["edgeId"])
        await expect(row).to_contain_text("idle" if s["idle"] else "active")
        await expect(row).to_contain_text(s["focus"] or "—")
    assert sorted((s["idle"], s["focus"]) for s in by_socket.values()) == [(False, "c-general"), (True, None)]

    # A reload keeps the token (this tab's sessionStorage) and the account in the address.
    await page.reload()
    await expect(page.get_by_test_id("user-status")).to_have_text("invisible", timeout=WAIT_MS)
    await expect(page.get_by_test_id("token-form")).to_be_hidden()
    await page.get_by_test_id("search-input").fill(ids("nobody-here"))
    await page.get_by_test_id("search-button").click()
    await expect(page.get_by_test_id("user-error")).to_contain_text("No account", timeout=WAIT_MS)
    await page.get_by_test_id("search-input").fill(ada)
    await page.get_by_test_id("search-button").click()
    await expect(page.get_by_test_id("user-status")).to_have_text("invisible", timeout=WAIT_MS)

    shot = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path / "admin.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert not errors, errors
    await one.close()
    await two.close()
