"""`presence drain [--edge URL]`: drain one edge (protocol.md "Drain and resume").

The command reaches the edge through its internal port, with the internal token, and asks it to
drain (`GET /api/v1/internal/edge/drain`: a GET like every route there, and harmless to repeat).
The edge answers `/healthz` 503 at once, keeps accepting for its grace, closes its sockets with
1012 over its drain window, hands their departures to the shards and stops; its supervisor starts
it again. Without `--edge` it drains the edge of this data directory (`cluster.json`).
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.config import Settings
from cluster.runtime import internal_token, read_info

DRAIN_PATH = "/api/v1/internal/edge/drain"
HEALTH_PATH = "/healthz"
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Health:
    """What an edge's /healthz said: None when it did not answer at all; `busy` when that was a
    time-out (something accepted the connection but said nothing in time: an edge too busy, not
    gone)."""

    status: int | None
    edge: str | None = None
    draining: bool = False
    busy: bool = False

    def gone(self, edge_id: str | None) -> bool:
        """The edge `edge_id` has stopped: nobody answers (refused), or another process does. A
        time-out is an edge too busy to answer (draining thousands of sockets), not a stopped one."""
        if self.status is None:
            return not self.busy
        return edge_id is not None and self.edge != edge_id


def get_json(url: str, token: str | None, timeout_s: float = TIMEOUT_S) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of a GET; raises OSError when nobody answers."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read() or b"{}")
        except ValueError:
            body = {}
        return e.code, body


def health(base_url: str, timeout_s: float = 2.0) -> Health:
    try:
        status, body = get_json(base_url + HEALTH_PATH, None, timeout_s)
    except (OSError, ValueError) as e:
        # urllib wraps a connect time-out in a URLError (its `reason`); a read time-out is bare.
        return Health(None, busy=isinstance(getattr(e, "reason", e), TimeoutError))
    return Health(status, body.get("edge"), bool(body.get("draining")))


def request_drain(base_url: str, token: str | None) -> dict[str, Any]:
    """Ask the edge at `base_url` (its internal URL) to drain; its answer. Raises DrainRefused."""
    try:
        status, body = get_json(base_url + DRAIN_PATH, token)
    except (OSError, ValueError) as e:
        raise DrainRefused(f"the edge at {base_url} {unanswered(e)}") from None
    if status == 401:
        raise DrainRefused(
            f"the edge at {base_url} refused the internal token: set PRESENCE_INTERNAL_TOKEN "
            "(or pass the --data-dir of the service, whose internal-token file holds it)"
        )
    if status != 200:
        raise DrainRefused(f"the edge at {base_url} answered {status}: {body.get('error', body)}")
    return body


def unanswered(error: OSError | ValueError) -> str:
    """What went wrong asking an edge, as the end of "the edge at URL …". urllib wraps the
    socket's error in a URLError, and its name alone was all `presence drain` said (`did not answer
    (URLError)`, whether nothing listened, the host did not resolve or the answer took too long)."""
    reason = getattr(error, "reason", error)
    if isinstance(reason, TimeoutError):
        return f"did not answer within {TIMEOUT_S:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "refused the connection: no edge listens there (is it running, and is that its internal port?)"
    if isinstance(reason, socket.gaierror):
        return f"could not be reached: cannot resolve the host ({reason.strerror or reason})"
    if isinstance(reason, OSError):
        return f"could not be reached: {reason.strerror or reason or type(reason).__name__}"
    if isinstance(error, ValueError):
        return "answered something that is not JSON (is that an edge's internal port?)"
    return f"did not answer ({reason or type(reason).__name__})"


class DrainRefused(RuntimeError):
    """The edge could not be asked to drain; the message says why, in one line."""


class DrainUsage(DrainRefused):
    """Nothing was asked: no URL to ask (exit 2, as for the other commands' usage errors)."""


def wait_gone(
    base_url: str,
    edge_id: str | None,
    timeout_s: float,
    probe: Callable[[str], Health] = health,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until the edge `edge_id` no longer answers at `base_url` (stopped, or already
    replaced by a new process). False: still there after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if probe(base_url).gone(edge_id):
            return True
        sleep(0.5)
    return False


def edge_url(settings: Settings, edge: str | None) -> str:
    if edge:
        try:
            parts = urllib.parse.urlsplit(edge)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:  # "http://[::1": not even a URL
            usable = False
        if not usable:
            # Before: "did not answer (ValueError)", as if something had been tried.
            raise DrainUsage(f"--edge {edge!r} is not an edge's internal URL (http://HOST:PORT)")
        return edge.rstrip("/")
    info = read_info(settings.data_dir)
    if info is None or not info.internal_url:
        raise DrainUsage(
            f"no running service found in {settings.data_dir}: pass --edge http://HOST:PORT "
            "(an edge's internal URL) or the --data-dir of `presence up`"
        )
    return info.internal_url.rstrip("/")


def drain(settings: Settings, edge: str | None, wait: bool) -> int:
    try:
        url = edge_url(settings, edge)
        answer = request_drain(url, internal_token(settings))
    except DrainRefused as e:
        print(f"presence drain: {e}", file=sys.stderr)
        return 2 if isinstance(e, DrainUsage) else 1
    if answer.get("alreadyDraining"):
        print(f"edge {answer.get('edge')} at {url} was already draining", flush=True)
    else:
        print(
            f"edge {answer.get('edge')} at {url} draining: /healthz answers 503 now; its "
            f"{answer.get('sockets')} sockets are closed with 1012 over {answer.get('windowS')} s "
            f"after {answer.get('graceS')} s, and their accounts may resume for {answer.get('resumeS')} s",
            flush=True,
        )
    if not wait:
        return 0
    budget = float(answer.get("graceS") or 0) + float(answer.get("windowS") or 0) + 60.0
    if not wait_gone(url, answer.get("edge"), budget):
        print(
            f"presence drain: edge {answer.get('edge')} still answers after {budget:.0f} s",
            file=sys.stderr,
        )
        return 1
    print(f"edge {answer.get('edge')} drained and stopped", flush=True)
    return 0
