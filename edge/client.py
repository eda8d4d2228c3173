"""The internal API's client, for other services: two seconds, then `None`.

    from edge.client import PresenceClient
    presence = PresenceClient("http://10.0.0.10:8766")
    presence.online_count("g1")         # 12, or None
    presence.is_focused("u1", "c1")     # True/False, or None
    await presence.aonline_count("g1")  # the same from asyncio code

An invite preview that hangs because presence is restarting is worse than one that omits the
count, so every failure (refused, reset, timed out, a 4xx or 5xx, a body that is not what we
expect) answers `None` rather than raising. The two seconds bound the whole call, not each of
its socket operations (a server sending its answer a byte at a time would otherwise hold the
caller for as long as it likes). A redirect is not followed (it is `None`): urllib would carry
the bearer token to whatever host it names. Only the standard library: importing this costs a
caller nothing.

When the edges require an internal token (`PRESENCE_INTERNAL_TOKEN`), pass it as `token=`; by
default the client sends the one in its own environment's `PRESENCE_INTERNAL_TOKEN`, if any.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 2.0


TOKEN_ENV = "PRESENCE_INTERNAL_TOKEN"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is not an answer of the internal API: never followed (urllib would send the bearer
    token on to the host it names), so it ends as an HTTPError, that is `None`."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class PresenceClient:
    def __init__(self, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None

    def _get(self, path: str, **params: str) -> object:
        """The answer's JSON within `timeout_s` of the call, else None. The request runs in a
        daemon thread of its own, left behind if it overruns: its socket operations time out on
        their own, and the caller has its `None` already."""
        answer: list[object] = []
        worker = threading.Thread(target=lambda: answer.append(self._fetch(path, params)), daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        return answer[0] if answer else None

    def _fetch(self, path: str, params: dict[str, str]) -> object:
        url = f"{self.base_url}/api/v1/internal/presence/{path}?{urllib.parse.urlencode(params)}"
        request = urllib.request.Request(url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                if response.status != 200:
                    return None
                return json.loads(response.read(64 * 1024))
        except (TimeoutError, urllib.error.URLError, OSError, ValueError, http_client_errors()):
            return None

    def online_count(self, server_id: str) -> int | None:
        body = self._get("online", serverId=server_id)
        value = body.get("online") if isinstance(body, dict) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return None

    def is_focused(self, user_id: str, channel_id: str) -> bool | None:
        body = self._get("focus", userId=user_id, channelId=channel_id)
        value = body.get("focused") if isinstance(body, dict) else None
        if isinstance(value, bool):
            return value
        return None

    async def aonline_count(self, server_id: str) -> int | None:
        return await self._in_thread(self.online_count, server_id)

    async def ais_focused(self, user_id: str, channel_id: str) -> bool | None:
        return await self._in_thread(self.is_focused, user_id, channel_id)

    async def _in_thread(self, fn: Callable[..., T], *args: str) -> T | None:
        # The blocking call has its own timeout; the outer one bounds the thread hand-off too.
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), self.timeout_s + 0.5)
        except TimeoutError:
            return None


def http_client_errors() -> type[Exception]:
    import http.client

    return http.client.HTTPException


def online_count(
    base_url: str, server_id: str, timeout_s: float = DEFAULT_TIMEOUT_S, token: str | None = None
) -> int | None:
    return PresenceClient(base_url, timeout_s, token).online_count(server_id)


def is_focused(
    base_url: str,
    user_id: str,
    channel_id: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    token: str | None = None,
) -> bool | None:
    return PresenceClient(base_url, timeout_s, token).is_focused(user_id, channel_id)
