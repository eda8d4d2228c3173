"""HS256 tokens naming an account: minted by `presence token`, verified by every edge.

Pure: no I/O, the clock is an argument. The algorithm list is fixed so that `alg: none` or a
token signed with another algorithm can never pass.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import jwt

from actors.core.ids import id_problem, is_demo_id

ALGORITHM = "HS256"
# The longest a token may still have to live when it is presented (cluster/config.py
# `token_max_ttl_s` overrides it), plus a little slack for a minting host whose clock runs ahead.
DEFAULT_MAX_TTL_S = 24 * 3600
CLOCK_LEEWAY_S = 60


class TokenError(ValueError):
    """The token is missing, malformed, badly signed, expired, too long-lived or names nobody."""


def demo_secret(secret: str) -> str:
    """The key of demo tokens, derived from the service's secret: a token signed with it is
    accepted only for an id in the demo's reserved namespace, so the demo page can never mint a
    token that acts as a real account."""
    return hmac.new(secret.encode(), b"presence demo tokens v1", hashlib.sha256).hexdigest()


def mint_token(user_id: str, secret: str, ttl_s: int = 24 * 3600, now: float | None = None) -> str:
    problem = id_problem(user_id)
    if problem is not None:
        raise ValueError(f"a token must name a valid account: {problem}")
    issued = int(time.time() if now is None else now)
    return jwt.encode({"sub": user_id, "iat": issued, "exp": issued + ttl_s}, secret, algorithm=ALGORITHM)


def _claims(token: str, secret: str) -> dict[str, object]:
    return jwt.decode(
        token,
        secret,
        algorithms=[ALGORITHM],
        # Every time claim is checked below against `current`, never against PyJWT's own
        # clock; `iat` is informational (a minting host's clock a little ahead is no reason
        # to refuse a token).
        options={
            "require": ["sub", "exp"],
            "verify_exp": False,
            "verify_iat": False,
            "verify_nbf": False,
        },
    )


def verify_token(
    token: str,
    secret: str,
    now: float | None = None,
    max_ttl_s: float = DEFAULT_MAX_TTL_S,
    demo_key: str | None = None,
) -> str:
    """The account id the token names, or TokenError.

    With `demo_key` (an edge serving the demo), a token signed with it is accepted too, but only
    for a demo id; a token signed with `secret` is never accepted for a demo id."""
    demo = False
    try:
        try:
            claims = _claims(token, secret)
        except jwt.InvalidSignatureError:
            if demo_key is None:
                raise
            claims = _claims(token, demo_key)
            demo = True
    except jwt.PyJWTError as e:
        raise TokenError(f"bad token: {e}") from None
    current = time.time() if now is None else now
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        raise TokenError("token has no valid exp")
    # Compared as given (Python compares a huge int with a float exactly, never overflowing);
    # NaN fails every comparison, so it lands on "expired".
    if exp > current + max_ttl_s + CLOCK_LEEWAY_S:
        raise TokenError("token lives longer than allowed")
    if not exp > current:
        raise TokenError("token expired")
    nbf = claims.get("nbf")
    if nbf is not None and (isinstance(nbf, bool) or not isinstance(nbf, int | float) or not nbf <= current):
        raise TokenError("token not yet valid")
    sub = claims.get("sub")
    if not isinstance(sub, str) or id_problem(sub) is not None:
        raise TokenError("token names no valid account")
    if is_demo_id(sub) != demo:
        raise TokenError("token names no valid account")
    return sub
