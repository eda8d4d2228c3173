"""HS256 tokens naming an account: minted by `presence token`, verified by every edge.

Pure: no I/O, the clock is an argument. The algorithm list is fixed so that `alg: none` or a
token signed with another algorithm can never pass.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import re
import time
import warnings

import jwt
import orjson
from jwt.algorithms import HMACAlgorithm
from jwt.exceptions import InvalidKeyError
from jwt.warnings import InsecureKeyLengthWarning

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


# -- verification --------------------------------------------------------------------------------
#
# Every identify verifies a token, so a reconnect storm is a storm of verifications; PyJWT's
# `jwt.decode` spent most of its time preparing the key again on every call (its asymmetric-key
# and JWK sniffing) and merging options. What follows is the same decision, taken directly: it
# accepts and refuses exactly what `jwt.decode(token, key, algorithms=["HS256"],
# options={"require": ["sub", "exp"], "verify_exp": False, "verify_iat": False,
# "verify_nbf": False})` did (tests/unit/test_tokens.py checks the two against each other), with
# PyJWT's texts in the errors. Minting stays on PyJWT: it is not hot.

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_SEGMENT = re.compile(r"[A-Za-z0-9_-]*")
# A segment of 4n+2 characters carries 4 unused bits in its last one, of 4n+3 two: they must be 0.
_CLEAN_LAST = {2: _ALPHABET[::16], 3: _ALPHABET[::4]}
_PADDING = {0: b"", 2: b"==", 3: b"="}
_TO_STANDARD = bytes.maketrans(b"-_", b"+/")
# The header every mainstream library writes for HS256 (PyJWT sorts its keys; jsonwebtoken and
# jose write them in this order): a token carrying it needs no header parsing. Any other header
# is parsed and checked in full.
_PLAIN_HEADERS = frozenset({base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode()})
# PyJWT understands one critical header extension, `b64` (RFC 7797), and refuses the others.
_SUPPORTED_CRIT = "b64"


class _SignatureMismatch(TokenError):
    """The token is well formed but not signed with this key: the one failure after which the demo
    key may still be tried."""


def _segment(segment: str, name: str) -> bytes:
    """A base64url segment, as strictly as PyJWT reads it: the URL-safe alphabet, either no padding
    or exactly the right padding, and no stray bits in the last character (one token, one
    spelling; PyJWT checks that by encoding the bytes again, this by the last character)."""
    stripped = segment.rstrip("=")
    padding = len(segment) - len(stripped)
    tail = len(stripped) % 4
    if (
        (padding and (padding > 2 or len(segment) % 4))
        or tail == 1
        or not _SEGMENT.fullmatch(stripped)
        or (tail and stripped[-1] not in _CLEAN_LAST[tail])
    ):
        raise TokenError(f"bad token: Invalid {name} padding")
    return binascii.a2b_base64(stripped.encode().translate(_TO_STANDARD) + _PADDING[tail])


def _json_object(data: bytes, what: str) -> dict[str, object]:
    """A JSON object as PyJWT's parser (json) reads it, or TokenError in PyJWT's words."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise TokenError(f"bad token: Invalid {what} string: {e}") from None
    if not isinstance(value, dict):
        raise TokenError(f"bad token: Invalid {what} string: must be a json object")
    return value


def _check_header(segment: str) -> None:
    """The rules PyJWT applies to a header before it looks at the signature; all of them refuse,
    none lets the demo key be tried."""
    # json, not orjson: a header other than the plain one is rare, and json.loads is the very
    # parser PyJWT used (it reads UTF-16/32, NaN, big integers), so the decision is the same.
    header = _json_object(_segment(segment, "header"), "header")
    if "kid" in header and not isinstance(header["kid"], str):
        raise TokenError("bad token: Key ID header parameter must be a string")
    if "crit" in header:
        crit = header["crit"]
        if not isinstance(crit, list) or not crit:
            raise TokenError("bad token: Invalid 'crit' header: must be a non-empty list")
        for ext in crit:
            if ext != _SUPPORTED_CRIT or _SUPPORTED_CRIT not in header:
                raise TokenError("bad token: Unsupported or missing critical extension")
    # An unencoded, detached payload (RFC 7797) needs the payload from elsewhere: never here.
    if header.get("b64", True) is False:
        raise TokenError("bad token: detached payloads are not accepted")
    if "alg" not in header:
        raise TokenError("bad token: Algorithm not specified")
    if header["alg"] != ALGORITHM:
        raise TokenError("bad token: The specified alg value is not allowed")


@functools.lru_cache(maxsize=4)
def _mac(key: str) -> hmac.HMAC | str:
    """An HMAC-SHA256 keyed with `key`, to be copied for each token, or why the key is unusable.

    PyJWT's own key rules decide (no empty key, nothing that looks like a PEM, SSH, DER or JWK
    key), once per key instead of once per token. In practice two keys are ever seen (the secret
    and the demo key); the bound only keeps a test run or a misuse from growing the cache. The
    problem is PyJWT's text, which names the kind of key, never the key."""
    algorithm = HMACAlgorithm(HMACAlgorithm.SHA256)
    try:
        prepared = algorithm.prepare_key(key)
    except InvalidKeyError as e:
        return str(e)
    short = algorithm.check_key_length(prepared)
    if short:
        warnings.warn(short, InsecureKeyLengthWarning, stacklevel=2)
    return hmac.new(prepared, digestmod=hashlib.sha256)


def _signed_with(key: str, signing_input: bytes, signature: bytes) -> None:
    template = _mac(key)
    if isinstance(template, str):
        raise TokenError(f"bad token: {template}")
    mac = template.copy()
    mac.update(signing_input)
    if not hmac.compare_digest(signature, mac.digest()):
        raise _SignatureMismatch("bad token: Signature verification failed")


def _claims(token: str, secret: str, demo_key: str | None) -> tuple[dict[str, object], bool]:
    """The claims of a token signed with `secret`, or with `demo_key` (then True), as PyJWT's
    decode returned them; TokenError otherwise."""
    if not isinstance(token, str):
        raise TokenError("bad token: Invalid token type")
    # The segments are cut as PyJWT cuts them (a dot too many lands in the payload segment, whose
    # alphabet refuses it).
    signing_input, dot, signature_segment = token.rpartition(".")
    header_segment, dot_, payload_segment = signing_input.partition(".")
    if not dot or not dot_:
        raise TokenError("bad token: Not enough segments")
    if header_segment not in _PLAIN_HEADERS:
        _check_header(header_segment)
    payload = _segment(payload_segment, "payload")
    signature = _segment(signature_segment, "crypto")
    signed = signing_input.encode("ascii")  # every character passed the base64url alphabet
    demo = False
    try:
        _signed_with(secret, signed, signature)
    except _SignatureMismatch:
        if demo_key is None:
            raise
        _signed_with(demo_key, signed, signature)
        demo = True
    try:
        claims = orjson.loads(payload)
    except orjson.JSONDecodeError:
        # orjson refuses what json accepts (NaN, Infinity, numbers beyond a double, lone
        # surrogates, a BOM, UTF-16/32) and PyJWT used json: ask json, so the decision stays
        # PyJWT's. orjson reads integers beyond 64 bits as floats, which no claim check below
        # tells apart from the integer (both are far beyond any clock).
        claims = _json_object(payload, "payload")
    if not isinstance(claims, dict):
        raise TokenError("bad token: Invalid payload string: must be a json object")
    for claim in ("sub", "exp"):
        if claims.get(claim) is None:
            raise TokenError(f'bad token: Token is missing the "{claim}" claim')
    # PyJWT's checks with no audience, issuer or subject expected.
    if claims.get("aud"):
        raise TokenError("bad token: Invalid audience")
    if "sub" in claims and not isinstance(claims["sub"], str):
        raise TokenError("bad token: Subject must be a string")
    if "jti" in claims and not isinstance(claims["jti"], str):
        raise TokenError("bad token: JWT ID must be a string")
    return claims, demo


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
    claims, demo = _claims(token, secret, demo_key)
    return account_of(claims, demo, time.time() if now is None else now, max_ttl_s)


def account_of(claims: dict[str, object], demo: bool, current: float, max_ttl_s: float) -> str:
    """The account named by verified claims (signed with the demo key if `demo`), or TokenError:
    every time claim is checked against `current`, never against a library's own clock; `iat` is
    informational (a minting host's clock a little ahead is no reason to refuse a token)."""
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
