"""HS256 tokens naming an account: minted by `presence token`, verified by every edge.

Pure: no I/O, the clock is an argument. The algorithm list is fixed so that `alg: none` or a
token signed with another algorithm can never pass.
"""

from __future__ import annotations

import time

import jwt

ALGORITHM = "HS256"


class TokenError(ValueError):
    """The token is missing, malformed, badly signed, expired or names nobody."""


def mint_token(user_id: str, secret: str, ttl_s: int = 24 * 3600, now: float | None = None) -> str:
    if not user_id:
        raise ValueError("a token must name an account")
    issued = int(time.time() if now is None else now)
    return jwt.encode({"sub": user_id, "iat": issued, "exp": issued + ttl_s}, secret, algorithm=ALGORITHM)


def verify_token(token: str, secret: str, now: float | None = None) -> str:
    """The account id the token names, or TokenError."""
    try:
        claims = jwt.decode(
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
    except jwt.PyJWTError as e:
        raise TokenError(f"bad token: {e}") from None
    exp = claims.get("exp")
    current = time.time() if now is None else now
    if not isinstance(exp, int | float) or exp <= current:
        raise TokenError("token expired")
    nbf = claims.get("nbf")
    if nbf is not None and (not isinstance(nbf, int | float) or nbf > current):
        raise TokenError("token not yet valid")
    sub = claims.get("sub")
    if (
        not isinstance(sub, str)
        or not sub
        or len(sub) > 128
        or any(ord(c) < 32 or 127 <= ord(c) <= 159 or c in "\u2028\u2029" for c in sub)
    ):
        raise TokenError("token names no valid account")
    return sub
