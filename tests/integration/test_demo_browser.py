"""The demo page (edge/static/) in a real browser against a real cluster, and the demo site's HTTP rules.

The browser tests drive Debian's Chromium (/usr/bin/chromium) through playwright's Python package,
never a browser playwright downloads; they are skipped, with the reason, when either is missing.
Two windows as two demo accounts: what one does, the other sees.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import pytest

from cluster import db
from edge.demo import DEMO_ACCOUNTS, DEMO_CHANNEL, DEMO_GRAPH, DEMO_SERVER
from edge.server import Edge
from edge.tokens import demo_secret

from .conftest import INTERNAL_TOKEN, SECRET, Cluster

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 10_000  # patience for any one condition in the page


def _why_no_browser() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium): browser tests skipped"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is missing (pip install playwright): browser tests skipped"
    return None


NO_BROWSER = _why_no_browser()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=NO_BROWSER or "")


async def http_get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP GET, off the event loop (the edge serving it runs on this loop)."""

    def run() -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {INTERNAL_TOKEN}"})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    return await asyncio.to_thread(run)


@pytest.fixture(scope="module")
async def demo_edge(cluster: Cluster) -> AsyncIterator[Edge]:
    """An edge in demo mode, with the demo accounts loaded as `presence up` loads them."""
    conn = await asyncpg.connect(cluster.database_url)
    try:
        await db.load_fixture(conn, DEMO_GRAPH, allow_demo=True)
    finally:
        await conn.close()
    e = Edge(cluster.edge_config(demo=True))
    await e.start()
    yield e
    await e.stop()


# ------------------------------------------------------------------------------ plain HTTP


async def test_demo_token_only_for_demo_accounts(demo_edge: Edge) -> None:
    for path in (
        "/demo/token?user=mallory",
        "/demo/token",
        "/demo/token?user=",
        "/demo/token?user=Ada",
        "/demo/token?user=ada",  # a real account's id, never a demo one
        "/demo/token?user=demo:mallory",
    ):
        status, _, body = await http_get(demo_edge.ws_port, path)
        assert status == 403, path
        assert "token" not in json.loads(body)
    for user in DEMO_ACCOUNTS:
        status, headers, body = await http_get(demo_edge.ws_port, f"/demo/token?user={user}")
        assert status == 200
        assert headers["content-type"] == "application/json"
        claims = jwt.decode(json.loads(body)["token"], demo_secret(SECRET), algorithms=["HS256"])
        assert claims["sub"] == user


async def test_page_served_only_in_demo_mode(demo_edge: Edge, edge: Edge) -> None:
    status, headers, body = await http_get(demo_edge.ws_port, "/")
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    assert b'src="/demo.js"' in body
    for asset, kind in (
        ("/demo.js", "text/javascript"),
        ("/client/lastseen.js", "text/javascript"),
        ("/demo.css", "text/css"),
    ):
        status, headers, _ = await http_get(demo_edge.ws_port, asset)
        assert status == 200, asset
        assert headers["content-type"].startswith(kind), (asset, headers["content-type"])
    status, _, body = await http_get(demo_edge.ws_port, "/demo/config")
    assert status == 200
    assert json.loads(body) == {
        "accounts": list(DEMO_ACCOUNTS),
        "server": DEMO_SERVER,
        "channel": DEMO_CHANNEL,
        "prefix": "demo:",
    }
    for outside in ("/../demo.py", "/%2e%2e/demo.py", "/nothing-here.html", "/client/../../edge/demo.py"):
        status, _, _ = await http_get(demo_edge.ws_port, outside)
        assert status == 404, outside

    # Not in demo mode (`presence edge`, `presence up --no-demo`): nothing but the websocket.
    for path in ("/", "/index.html", "/demo.js", "/demo/config", "/demo/token?user=demo:ada"):
        status, _, body = await http_get(edge.ws_port, path)
        assert status == 404, path
        assert "token" not in json.loads(body)


# ------------------------------------------------------------------------------ in a browser


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh Chromium profile (one context; each page is a window)."""
    if NO_BROWSER is not None:
        pytest.skip(NO_BROWSER)
    from playwright.async_api import async_playwright

    pw = await async_playwright().start()
    try:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1100, "height": 640},
        )
        try:
            yield context
        finally:
            await context.close()
    finally:
        await pw.stop()


async def open_as(context: Any, base: str, user: str, errors: list[str]) -> Any:
    from playwright.async_api import expect

    page = await context.new_page()
    page.on("pageerror", lambda e: errors.append(f"[{user}] {e}"))
    await page.goto(f"{base}?as={user}")
    await expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "open", timeout=WAIT_MS)
    # Start from `online` whatever an earlier run left as the account's durable choice.
    await page.get_by_test_id("status-picker").select_option("online")
    await expect(page.get_by_test_id("my-dot")).to_have_attribute("data-status", "online", timeout=WAIT_MS)
    return page


def rgb(css: str) -> tuple[int, int, int]:
    m = re.match(r"rgba?\((\d+), (\d+), (\d+)", css)
    assert m, css
    return int(m[1]), int(m[2]), int(m[3])


# How the dot's colour family is recognised, in page JS: the computed colour may be mid-transition.
COLOUR_IS = {
    "red": "([r, g, b]) => r >= 180 && g <= 110 && b <= 110",
    "green": "([r, g, b]) => g >= 130 && r <= 110 && b <= 130",
    "grey": "([r, g, b]) => Math.max(r, g, b) - Math.min(r, g, b) <= 24 && r >= 90 && r <= 170",
}


async def wait_dot_colour(page: Any, user: str, family: str) -> tuple[int, int, int]:
    await page.wait_for_function(
        f"""() => {{
            const el = document.querySelector('[data-testid="dot-{user}"]');
            const rgb = getComputedStyle(el).backgroundColor.match(/\\d+/g).map(Number);
            return ({COLOUR_IS[family]})(rgb);
        }}""",
        timeout=WAIT_MS,
    )
    css = await page.get_by_test_id(f"dot-{user}").evaluate("e => getComputedStyle(e).backgroundColor")
    return rgb(css)


async def ring_matches_surface(page: Any, user: str) -> bool:
    """The dot is punched out: its ring is the colour of the first opaque surface behind it."""
    return bool(
        await page.get_by_test_id(f"dot-{user}").evaluate(
            """dot => {
                let el = dot.parentElement;
                while (el) {
                    const bg = getComputedStyle(el).backgroundColor;
                    if (bg !== 'rgba(0, 0, 0, 0)' && bg !== 'transparent' && el.className !== 'avatar')
                        return getComputedStyle(dot).borderTopColor === bg
                            && parseFloat(getComputedStyle(dot).borderTopWidth) >= 2;
                    el = el.parentElement;
                }
                return false;
            }"""
        )
    )


# Records every state ada's page shows for grace (dot status, last-seen line) from now on.
RECORD = """user => {
    window.__seen = [];
    const row = document.querySelector(`[data-testid="member-${user}"]`);
    const note = () => window.__seen.push([
        row.querySelector(`[data-testid="dot-${user}"]`).dataset.status,
        row.querySelector(`[data-testid="lastseen-${user}"]`).textContent,
    ]);
    note();
    const all = {subtree: true, childList: true, attributes: true, characterData: true};
    new MutationObserver(note).observe(row, all);
}"""


async def operator_last_seen(e: Edge, user: str) -> str | None:
    status, _, body = await http_get(e.internal_port, f"/api/v1/internal/presence/users/demo:{user}")
    assert status == 200
    value = json.loads(body)["lastSeenAt"]
    return None if value is None else str(value)


@needs_browser
async def test_two_windows_see_each_other(demo_edge: Edge, browser: Any) -> None:
    from playwright.async_api import expect

    base = f"http://127.0.0.1:{demo_edge.ws_port}/"
    errors: list[str] = []
    ada = await open_as(browser, base, "ada", errors)
    grace = await open_as(browser, base, "grace", errors)

    # Both online, green, each punched out of the member list's surface.
    await expect(ada.get_by_test_id("dot-grace")).to_have_attribute("data-status", "online", timeout=WAIT_MS)
    await expect(grace.get_by_test_id("dot-ada")).to_have_attribute("data-status", "online", timeout=WAIT_MS)
    await expect(ada.get_by_test_id("lastseen-grace")).to_have_text("Online")
    await wait_dot_colour(ada, "grace", "green")
    assert await ring_matches_surface(ada, "grace")
    # Members nobody opened are offline, grey, with no last-seen time yet.
    await expect(ada.get_by_test_id("dot-ken")).to_have_attribute("data-status", "offline")
    await expect(ada.get_by_test_id("lastseen-ken")).to_have_text("Offline")
    await expect(ada.get_by_test_id("dm-line")).to_have_text("Online")  # with grace
    await wait_dot_colour(ada, "ken", "grey")

    # Typing: grace types, ada reads "grace is typing…".
    await grace.get_by_test_id("message-input").press_sequentially("hello")
    typing = ada.get_by_test_id("typing")
    await expect(typing).to_have_text("grace is typing…", timeout=WAIT_MS)
    typing_seen = asyncio.get_running_loop().time()

    # Voice: ada joins and leaves; grace's roster follows.
    await ada.get_by_test_id("voice-join").click()
    await expect(grace.get_by_test_id("voice-ada")).to_be_visible(timeout=WAIT_MS)
    await expect(ada.get_by_test_id("voice-leave")).to_be_enabled()
    await ada.get_by_test_id("voice-leave").click()
    await expect(grace.get_by_test_id("voice-roster").locator("li")).to_have_count(0, timeout=WAIT_MS)

    # Do not disturb: red on the other side.
    await grace.get_by_test_id("status-picker").select_option("dnd")
    await expect(ada.get_by_test_id("dot-grace")).to_have_attribute("data-status", "dnd", timeout=WAIT_MS)
    r, g, b = await wait_dot_colour(ada, "grace", "red")
    assert r >= 180 and g <= 110 and b <= 110, (r, g, b)
    await expect(ada.get_by_test_id("lastseen-grace")).to_have_text("Do not disturb")
    # The direct-message header answers "will this be read now": dnd reads Online there.
    await expect(ada.get_by_test_id("dm-line")).to_have_text("Online")

    # The typing line lapses by itself (10 s after the only typing.start).
    await expect(typing).to_have_text("", timeout=15_000)
    lapsed_after = asyncio.get_running_loop().time() - typing_seen
    assert lapsed_after >= 8.0, f"typing lapsed after {lapsed_after:.1f} s"

    # Invisible: ada sees grace offline, grey, with a last-seen line that never says Online and
    # does not move.
    await ada.evaluate(RECORD, "grace")
    await grace.get_by_test_id("status-picker").select_option("invisible")
    await expect(grace.get_by_test_id("my-dot")).to_have_attribute(
        "data-status", "invisible", timeout=WAIT_MS
    )
    await expect(ada.get_by_test_id("dot-grace")).to_have_attribute("data-status", "offline", timeout=WAIT_MS)
    await wait_dot_colour(ada, "grace", "grey")
    line = ada.get_by_test_id("lastseen-grace")
    # The page asked again when grace went offline; the answer carries her last-seen minute.
    await expect(line).to_have_attribute(
        "data-last-seen-at", re.compile(r"^\d{4}-\d\d-\d\dT"), timeout=WAIT_MS
    )
    await expect(line).to_have_text("Active in the last 10 minutes")
    await expect(ada.get_by_test_id("dm-line")).to_have_text("Active in the last 10 minutes")
    first_text, first_at = await line.text_content(), await line.get_attribute("data-last-seen-at")
    exact_before = await operator_last_seen(demo_edge, "grace")
    assert exact_before is not None

    await ada.wait_for_timeout(2_500)  # on purpose: last-seen must stay frozen across this gap

    assert await operator_last_seen(demo_edge, "grace") == exact_before
    assert (await line.text_content(), await line.get_attribute("data-last-seen-at")) == (
        first_text,
        first_at,
    )
    seen = await ada.evaluate("() => window.__seen")
    assert seen, "the recorder saw nothing"
    shown_present = [s for s in seen if s[0] in ("online", "idle") or s[1] in ("Online", "Idle")]
    assert not shown_present, f"an invisible account was shown present: {shown_present}"
    assert seen[-1] == ["offline", "Active in the last 10 minutes"], seen

    # A fresh page (a new query) reads the same frozen time.
    await ada.reload()
    await expect(ada.get_by_test_id("connection")).to_have_attribute("data-state", "open", timeout=WAIT_MS)
    await expect(line).to_have_attribute("data-last-seen-at", first_at or "", timeout=WAIT_MS)
    await expect(ada.get_by_test_id("dot-grace")).to_have_attribute("data-status", "offline")
    assert await operator_last_seen(demo_edge, "grace") == exact_before

    # grace herself still sees her real status, and coming back shows her online again.
    await expect(grace.get_by_test_id("my-status-line")).to_contain_text("Invisible")
    await grace.get_by_test_id("status-picker").select_option("online")
    await expect(ada.get_by_test_id("dot-grace")).to_have_attribute("data-status", "online", timeout=WAIT_MS)
    await expect(line).to_have_text("Online")
    assert not errors, errors


@needs_browser
async def test_page_reconnects_and_resubscribes_when_its_edge_restarts(
    cluster: Cluster, demo_edge: Edge, browser: Any
) -> None:
    """The page's client (clients/js) through an edge restart on the same port: it shows the
    wait, comes back by itself, and its member list is live again (resubscribed)."""
    from playwright.async_api import expect

    e = Edge(cluster.edge_config(demo=True))  # demo_edge loaded the demo accounts
    await e.start()
    port = e.ws_port
    base = f"http://127.0.0.1:{port}/"
    errors: list[str] = []
    try:
        linus = await open_as(browser, base, "linus", errors)
        connection = linus.get_by_test_id("connection")
        await e.stop()
        await expect(connection).to_have_attribute("data-state", "closed", timeout=WAIT_MS)
        await expect(connection).to_contain_text("reconnecting in")
        e = Edge(cluster.edge_config(demo=True, ws_port=port))
        await e.start()
        await expect(connection).to_have_attribute("data-state", "open", timeout=2 * WAIT_MS)
        ken = await open_as(browser, base, "ken", errors)
        await expect(linus.get_by_test_id("dot-ken")).to_have_attribute(
            "data-status", "online", timeout=WAIT_MS
        )
        await ken.close()
        await expect(linus.get_by_test_id("dot-ken")).to_have_attribute(
            "data-status", "offline", timeout=WAIT_MS
        )
    finally:
        await e.stop()
    assert not errors, errors
