"""Ray's token authentication (Ray 2.60), decided before `ray` is imported.

Ray reads `RAY_AUTH_MODE` (`token` or `disabled`) and the token (`RAY_AUTH_TOKEN`, else the file
named by `RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`) when it is imported and when it starts
or joins a cluster. With token authentication every Ray gRPC call (GCS, raylets, actor workers)
carries the token, and a caller without it is refused: without it, anyone who reaches a Ray port
can call `shard-N.apply()` and act as any account.

- `presence up` without `RAY_ADDRESS` starts a local instance with tokens on (unless
  `RAY_AUTH_MODE=disabled` is set), its token file created 0600 or tightened to 0600.
- A process joining an explicit address with `RAY_AUTH_MODE` unset first asks the cluster (a
  one-second probe in a subprocess); if it requires tokens, the mode is set when a token is at
  hand, else the command stops with one line saying what to set.

This module does not import `ray` itself: the main process may not have chosen its mode yet. When
Ray is already imported (tests), its cached configuration is refreshed after the mode changes.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
PROBE_TIMEOUT_S = 15.0


def token_path() -> Path:
    """Where Ray looks for the token file: `RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`."""
    named = os.environ.get(TOKEN_PATH_VAR)
    return Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"


def ensure_token_file(path: Path | None = None) -> Path:
    """The token file, created with a fresh token if missing; owner-only (0600) either way."""
    path = path or token_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written whole under a private name, then linked into place: a process starting Ray at the
    # same moment (parallel test workers, two `presence up`) either finds no file or a complete
    # one, never an empty one, and exactly one token wins.
    fd, draft = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.link(draft, path)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
            print(f"presence: Ray's token file {path} was readable by others; now 0600", file=sys.stderr)
    finally:
        os.unlink(draft)
    return path


def _set_mode(mode: str) -> None:
    os.environ[MODE_VAR] = mode
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:  # Ray read its configuration when imported: make it read it again
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def token_available() -> bool:
    return bool(os.environ.get(TOKEN_VAR)) or token_path().is_file()


def prepare_local() -> str:
    """For a new local Ray instance: tokens on unless disabled explicitly. Returns the mode."""
    mode = os.environ.get(MODE_VAR, "token").lower()
    if mode == "token" and not os.environ.get(TOKEN_VAR):
        ensure_token_file()
    _set_mode(mode)
    if mode != "token":
        print(
            f"presence: WARNING: Ray token authentication is off ({MODE_VAR}={mode}): anyone who reaches "
            "a Ray port can call the shards",
            file=sys.stderr,
        )
    return mode


def explicit(address: str | None) -> bool:
    """An address Ray does not resolve itself through this machine's `ray start` files."""
    return bool(address) and address not in ("auto", "local")


def prepare_join(address: str | None) -> None:
    """Before joining `address`: choose the mode the cluster needs, or exit with one line."""
    if os.environ.get(MODE_VAR):
        if os.environ[MODE_VAR].lower() == "token" and not token_available():
            raise SystemExit(
                f"presence: {MODE_VAR}=token but no Ray token: put the cluster's token in {token_path()} "
                f"(or set {TOKEN_PATH_VAR} or {TOKEN_VAR})"
            )
        if os.environ[MODE_VAR].lower() == "token" and not os.environ.get(TOKEN_VAR):
            ensure_token_file()  # tighten an existing file's mode
        return
    if not explicit(address):
        if token_path().is_file() and not os.environ.get(TOKEN_VAR):
            ensure_token_file()  # Ray turns tokens on by itself when this file exists
        return
    assert address is not None
    answer = probe(address)
    if answer == "ok":
        return
    if answer == "auth":
        if token_available():
            _set_mode("token")
            print(
                f"presence: the Ray cluster at {address} requires token authentication: using "
                f"{MODE_VAR}=token",
                file=sys.stderr,
            )
            return
        raise SystemExit(
            f"presence: the Ray cluster at {address} requires token authentication: set {MODE_VAR}=token "
            f"and put its token in {token_path()} (or set {TOKEN_PATH_VAR} or {TOKEN_VAR})"
        )
    raise SystemExit(f"presence: cannot join Ray at {address}: {answer}")


_PROBE = """
import sys
from ray._raylet import GcsClient
from ray.exceptions import AuthenticationError
try:
    GcsClient(address=sys.argv[1])
except AuthenticationError:
    print("auth")
except Exception as e:
    print("error", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
else:
    print("ok")
"""


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """`ok`, `auth` (the cluster wants a token this process does not send) or what went wrong.

    Runs in a subprocess with tokens off, so this process's Ray is not imported before its mode
    is chosen, and a cluster that does not answer costs `timeout_s`, not Ray's minute of retries.
    """
    env = {**os.environ, MODE_VAR: "disabled", "RAY_BACKEND_LOG_LEVEL": "fatal"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, address],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return f"no answer from its GCS within {timeout_s:.0f} s (check the address and the firewall)"
    lines = out.stdout.strip().splitlines()
    answer = lines[-1] if lines else f"probe failed: {out.stderr.strip().splitlines()[-1:]}"
    if answer.startswith("error"):
        return "no answer from its GCS (" + answer.removeprefix("error ").strip() + ")"
    return answer
