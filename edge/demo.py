"""The demo site served on the public port in demo mode: plain files from `edge/static/`, and
tokens for the demo accounts (and only those), so two browser windows can show dots moving.

The demo's accounts, server and channel live in a reserved namespace (`demo:…`, see
actors/core/ids.py): `presence load` refuses such ids and tokens signed with the service's secret
never name one, so no real account is a demo account. Demo tokens are signed with a key derived
from the secret (`edge.tokens.demo_secret`), which edges accept for demo ids only, and only while
they serve the demo. `presence up` serves it only on a loopback host with the embedded database.

No build step: the files are served as they are. The page's socket code is the JavaScript client
itself (`clients/js/src`, the one copy, served under `/client/`), so the demo exercises what
applications import.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from actors.core.ids import DEMO_PREFIX
from edge.tokens import demo_secret, mint_token

STATIC = Path(__file__).with_name("static")
# The JavaScript client (and the last-seen display helper it shares with the page), in the source
# tree beside the package: served under /client/ so the browser imports the very files npm packs.
# In a wheel the same files are packaged as edge/client_js (pyproject's package-dir).
_CHECKOUT_JS = Path(__file__).resolve().parents[1] / "clients" / "js" / "src"
CLIENT_JS = _CHECKOUT_JS if _CHECKOUT_JS.is_dir() else Path(__file__).with_name("client_js")
CLIENT_PREFIX = "/client/"
DEMO_ACCOUNTS = tuple(f"{DEMO_PREFIX}{name}" for name in ("ada", "grace", "linus", "margaret", "ken"))
DEMO_SERVER = f"{DEMO_PREFIX}server"
DEMO_CHANNEL = f"{DEMO_PREFIX}general"
DEMO_GRAPH = {
    "users": [{"id": u} for u in DEMO_ACCOUNTS],
    "servers": [{"id": DEMO_SERVER, "members": list(DEMO_ACCOUNTS), "channels": [DEMO_CHANNEL]}],
}


def _response(status: int, body: bytes, content_type: str) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
        ]
    )
    import http

    return Response(status, http.HTTPStatus(status).phrase, headers, body)


class DemoSite:
    def __init__(self, secret: str, static: Path = STATIC, client_js: Path = CLIENT_JS) -> None:
        self.key = demo_secret(secret)
        self.static = static.resolve()
        self.client_js = client_js.resolve()

    def handle(self, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if url.path == "/demo/token":
            user = parse_qs(url.query).get("user", [""])[0]
            if user not in DEMO_ACCOUNTS:
                return _response(
                    403,
                    orjson.dumps({"error": "tokens are minted for demo accounts only"}),
                    "application/json",
                )
            return _response(
                200, orjson.dumps({"token": mint_token(user, self.key, ttl_s=3600)}), "application/json"
            )
        if url.path == "/demo/config":
            body = {
                "accounts": list(DEMO_ACCOUNTS),
                "server": DEMO_SERVER,
                "channel": DEMO_CHANNEL,
                "prefix": DEMO_PREFIX,
            }
            return _response(200, orjson.dumps(body), "application/json")
        root = self.static
        name = "index.html" if url.path in ("", "/") else url.path.lstrip("/")
        if url.path.startswith(CLIENT_PREFIX):
            root, name = self.client_js, url.path[len(CLIENT_PREFIX) :]
        target = (root / name).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            return None
        content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if target.suffix in (".js", ".mjs"):
            content_type = "text/javascript"
        return _response(200, target.read_bytes(), f"{content_type}; charset=utf-8")
