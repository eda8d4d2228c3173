"""HS256 tokens (protocol.md): `sub` is the account, `exp` is required, only HS256 passes; a bad
or expired token is refused. The clock is an argument, so every case runs at a fixed time."""

from __future__ import annotations

import base64
import json
import time
import warnings

import jwt
import pytest

from edge.tokens import ALGORITHM, TokenError, mint_token, verify_token

from .conftest import T0

SECRET = "a-test-secret-that-is-long-enough-for-hs256!"
OTHER = "another-secret-that-is-also-long-enough-for-it"


def b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def encode(claims: dict[str, object], secret: str = SECRET, algorithm: str = "HS256") -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jwt.encode(claims, secret, algorithm=algorithm)


def test_round_trip() -> None:
    token = mint_token("u1", SECRET, ttl_s=60, now=T0)
    assert verify_token(token, SECRET, now=T0 + 1) == "u1"
    claims = jwt.decode(
        token, SECRET, algorithms=["HS256"], options={"verify_exp": False, "verify_iat": False}
    )
    assert claims == {"sub": "u1", "iat": int(T0), "exp": int(T0) + 60}
    assert jwt.get_unverified_header(token)["alg"] == ALGORITHM == "HS256"


def test_default_ttl_is_a_day() -> None:
    token = mint_token("u1", SECRET, now=T0)
    assert verify_token(token, SECRET, now=T0 + 86_399) == "u1"
    with pytest.raises(TokenError):
        verify_token(token, SECRET, now=T0 + 86_400)


@pytest.mark.parametrize("offset", [60, 61, 3600])
def test_expired(offset: int) -> None:
    token = mint_token("u1", SECRET, ttl_s=60, now=T0)
    with pytest.raises(TokenError):
        verify_token(token, SECRET, now=T0 + offset)


def test_real_clock_by_default() -> None:
    assert verify_token(mint_token("u1", SECRET, ttl_s=60), SECRET) == "u1"
    with pytest.raises(TokenError):
        verify_token(mint_token("u1", SECRET, ttl_s=60, now=time.time() - 120), SECRET)


def test_injected_clock_governs_every_time_claim() -> None:
    """Pure: the result depends on `now`, not on the machine's clock (T0 is in 2027)."""
    token = mint_token("u1", SECRET, ttl_s=60, now=T0)
    assert verify_token(token, SECRET, now=T0) == "u1"


def test_token_minted_on_a_clock_slightly_ahead_is_accepted() -> None:
    """The host application mints tokens on other machines; a few seconds of skew in `iat` do not
    make a token bad (the contract refuses bad or expired tokens only)."""
    token = mint_token("u1", SECRET, ttl_s=600, now=time.time() + 5)
    assert verify_token(token, SECRET) == "u1"


def test_not_before_is_honoured_with_the_injected_clock() -> None:
    token = encode({"sub": "u1", "exp": int(T0) + 600, "nbf": int(T0) + 100})
    with pytest.raises(TokenError):
        verify_token(token, SECRET, now=T0)
    assert verify_token(token, SECRET, now=T0 + 100) == "u1"


def test_other_key() -> None:
    token = mint_token("u1", OTHER, ttl_s=60, now=T0)
    with pytest.raises(TokenError):
        verify_token(token, SECRET, now=T0)


def test_alg_none() -> None:
    token = b64({"alg": "none", "typ": "JWT"}) + "." + b64({"sub": "u1", "exp": int(T0) + 60}) + "."
    with pytest.raises(TokenError):
        verify_token(token, SECRET, now=T0)


@pytest.mark.parametrize("alg", ["HS384", "HS512"])
def test_other_algorithms_with_the_right_secret(alg: str) -> None:
    token = encode({"sub": "u1", "exp": int(T0) + 60}, algorithm=alg)
    with pytest.raises(TokenError):
        verify_token(token, SECRET, now=T0)


def test_tampered_payload() -> None:
    header, _, sig = mint_token("u1", SECRET, ttl_s=60, now=T0).split(".")
    forged = f"{header}.{b64({'sub': 'admin', 'iat': int(T0), 'exp': int(T0) + 60})}.{sig}"
    with pytest.raises(TokenError):
        verify_token(forged, SECRET, now=T0)


@pytest.mark.parametrize(
    "claims",
    [
        {"exp": int(T0) + 60},  # no sub
        {"sub": "u1"},  # no exp
        {"sub": "", "exp": int(T0) + 60},
        {"sub": 42, "exp": int(T0) + 60},
        {"sub": "x" * 129, "exp": int(T0) + 60},
        {"sub": "a\nb", "exp": int(T0) + 60},
        {"sub": "a\x00b", "exp": int(T0) + 60},
        {"sub": "a\x7fb", "exp": int(T0) + 60},
        {"sub": "a\x85b", "exp": int(T0) + 60},  # C1 control (NEL)
        {"sub": "a\u2028b", "exp": int(T0) + 60},  # line separator
        {"sub": "u1", "exp": "tomorrow"},
        {"sub": "u1", "exp": None},
    ],
)
def test_bad_claims(claims: dict[str, object]) -> None:
    with pytest.raises(TokenError):
        verify_token(encode(claims), SECRET, now=T0)


def test_longest_valid_sub() -> None:
    assert verify_token(encode({"sub": "é" * 128, "exp": int(T0) + 60}), SECRET, now=T0) == "é" * 128


@pytest.mark.parametrize("garbage", ["", "abc", "a.b.c", "Bearer x", "....", "e30.e30.", "\x00"])
def test_garbage(garbage: str) -> None:
    with pytest.raises(TokenError):
        verify_token(garbage, SECRET, now=T0)


def test_token_error_is_a_value_error() -> None:
    assert issubclass(TokenError, ValueError)


def test_mint_needs_an_account() -> None:
    with pytest.raises(ValueError):
        mint_token("", SECRET)


# -- the id rule and lifetime limits (issue 14) -------------------------------------------------


@pytest.mark.parametrize(
    "sub",
    [
        "a\ud800b",  # lone surrogate: crashed the connection handler before
        "a\u200bb",  # zero-width space
        "admin\u202e",  # right-to-left override
        "\ufeffu1",
        "a\u2029b",
    ],
)
def test_sub_breaking_the_id_rule_is_refused(sub: str) -> None:
    # json.dumps escapes the surrogate as \ud800, which PyJWT's json.loads turns back into one.
    with pytest.raises(TokenError):
        verify_token(encode({"sub": sub, "exp": int(T0) + 60}), SECRET, now=T0)


@pytest.mark.parametrize("exp", [10**300, 10**400, 1e308, int(T0) + 86_400 + 3600])
def test_exp_too_far_ahead_is_refused(exp: float) -> None:
    with pytest.raises(TokenError, match="longer than allowed"):
        verify_token(encode({"sub": "u1", "exp": exp}), SECRET, now=T0)


def test_non_finite_or_odd_exp_is_refused() -> None:
    h = b64({"alg": "HS256", "typ": "JWT"})
    for payload in ('{"sub":"u1","exp":NaN}', '{"sub":"u1","exp":Infinity}', '{"sub":"u1","exp":true}'):
        p = base64.urlsafe_b64encode(payload.encode()).rstrip(b"=").decode()
        import hashlib
        import hmac

        sig = hmac.new(SECRET.encode(), f"{h}.{p}".encode(), hashlib.sha256).digest()
        token = f"{h}.{p}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"
        with pytest.raises(TokenError):
            verify_token(token, SECRET, now=T0)


def test_max_lifetime_is_configurable() -> None:
    token = mint_token("u1", SECRET, ttl_s=7 * 86_400, now=T0)
    with pytest.raises(TokenError):
        verify_token(token, SECRET, now=T0)
    assert verify_token(token, SECRET, now=T0, max_ttl_s=7 * 86_400) == "u1"
    # A day-long token from a host whose clock runs a little ahead still passes.
    assert verify_token(mint_token("u1", SECRET, now=T0 + 30), SECRET, now=T0) == "u1"


def test_demo_tokens_name_demo_ids_only() -> None:
    from edge.tokens import demo_secret

    key = demo_secret(SECRET)
    assert key != SECRET
    demo = mint_token("demo:ada", key, ttl_s=60, now=T0)
    assert verify_token(demo, SECRET, now=T0, demo_key=key) == "demo:ada"
    with pytest.raises(TokenError):  # an edge without the demo refuses demo tokens
        verify_token(demo, SECRET, now=T0)
    with pytest.raises(TokenError):  # a demo token for a real account
        verify_token(mint_token("ada", key, ttl_s=60, now=T0), SECRET, now=T0, demo_key=key)
    with pytest.raises(TokenError):  # a real token for a demo account
        verify_token(mint_token("demo:ada", SECRET, ttl_s=60, now=T0), SECRET, now=T0, demo_key=key)
    assert verify_token(mint_token("ada", SECRET, ttl_s=60, now=T0), SECRET, now=T0, demo_key=key) == "ada"
