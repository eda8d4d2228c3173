"""HS256 tokens (protocol.md): `sub` is the account, `exp` is required, only HS256 passes; a bad
or expired token is refused. The clock is an argument, so every case runs at a fixed time."""

from __future__ import annotations

import base64
import hmac
import json
import time
import warnings
from collections.abc import Mapping

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jwt.types import Options

from edge.tokens import (
    ALGORITHM,
    DEFAULT_MAX_TTL_S,
    TokenError,
    account_of,
    demo_secret,
    mint_token,
    verify_token,
)

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


# -- the hand verifier against PyJWT (issue 16) ---------------------------------------------------
#
# edge/tokens.py verifies without PyJWT (it was a tenth of an edge's time in a reconnect storm) and
# must take exactly PyJWT's decisions. The reference below is the verifier as it was: jwt.decode
# with the same options, the demo key tried on a bad signature only, then the same claim checks.

DEMO = demo_secret(SECRET)
_OPTIONS: Options = {
    "require": ["sub", "exp"],
    "verify_exp": False,
    "verify_iat": False,
    "verify_nbf": False,
}


def reference(token: str, secret: str, demo_key: str | None, now: float = T0) -> str | None:
    demo = False
    try:
        try:
            claims = jwt.decode(token, secret, algorithms=["HS256"], options=_OPTIONS)
        except jwt.InvalidSignatureError:
            if demo_key is None:
                return None
            claims = jwt.decode(token, demo_key, algorithms=["HS256"], options=_OPTIONS)
            demo = True
    except (jwt.PyJWTError, UnicodeEncodeError):  # PyJWT encodes the token first: a lone surrogate
        return None
    try:
        return account_of(claims, demo, now, DEFAULT_MAX_TTL_S)
    except TokenError:
        return None


def verified(token: str, secret: str, demo_key: str | None, now: float = T0) -> str | None:
    try:
        return verify_token(token, secret, now=now, demo_key=demo_key)
    except TokenError as e:
        # The edge sends the text to the client: it never carries a key.
        assert secret not in str(e) and (demo_key is None or demo_key not in str(e))
        return None


def seg(data: bytes, pad: bool = False) -> str:
    text = base64.urlsafe_b64encode(data).decode()
    return text if pad else text.rstrip("=")


def signed(header: bytes, payload: bytes, key: str, digest: str = "sha256", pad: bool = False) -> str:
    signing_input = f"{seg(header, pad)}.{seg(payload, pad)}"
    sig = hmac.new(key.encode(), signing_input.encode(), digest).digest()
    return f"{signing_input}.{seg(sig, pad)}"


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()  # NaN and infinities included: json.dumps writes them, PyJWT's json reads them
    | st.text(max_size=8)  # lone surrogates included
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
times = (
    st.integers(min_value=int(T0) - 200, max_value=int(T0) + DEFAULT_MAX_TTL_S + 200)
    | st.floats(min_value=T0 - 200, max_value=T0 + DEFAULT_MAX_TTL_S + 200)
    | json_values
)
CLAIMS = {
    "sub": st.sampled_from(["u1", "demo:ada", "ada", "", "a\u200bb", "x" * 129]) | json_values,
    "exp": times,
    "nbf": times,
    "iat": times,
    "aud": json_values,
    "jti": json_values,
    "extra": json_values,
}
HEADER = {
    "alg": st.sampled_from(["HS256", "none", "HS512", "hs256", "RS256", ""]) | json_values,
    "typ": json_values,
    "kid": st.text(max_size=4) | json_values,
    "crit": st.sampled_from([["b64"], [], ["exp"], "b64", ["b64", "b64"]]) | json_values,
    "b64": st.booleans() | json_values,
}


def edited(
    base: st.SearchStrategy[dict[str, object]], fields: Mapping[str, st.SearchStrategy[object]]
) -> st.SearchStrategy[dict[str, object]]:
    """`base` with a few fields set to odd values or removed ("-name"): mostly valid, so that the
    properties see acceptances as well as every way of being refused."""

    @st.composite
    def edit(draw: st.DrawFn) -> dict[str, object]:
        out = dict(draw(base))
        for name in draw(st.lists(st.sampled_from([*fields, *(f"-{f}" for f in fields)]), max_size=3)):
            if name.startswith("-"):
                out.pop(name[1:], None)
            else:
                out[name] = draw(fields[name])
        return out

    return edit()


claims_dicts = edited(
    st.fixed_dictionaries(
        {
            "sub": st.sampled_from(["u1", "demo:ada", "ada"]),
            "exp": st.integers(min_value=int(T0) + 1, max_value=int(T0) + 3600)
            | st.floats(min_value=T0 + 1, max_value=T0 + 3600),
        }
    ),
    CLAIMS,
)
plain_header = json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode()


@st.composite
def payload_bytes(draw: st.DrawFn) -> bytes:
    claims = draw(claims_dicts)
    kind = draw(st.sampled_from(["compact", "spaced", "utf-16", "bom", "raw"]))
    if kind == "raw":  # not an object, not JSON, duplicate keys
        return draw(
            st.sampled_from(
                [
                    *(b"[]", b"1", b'"u1"', b"null", b"NaN", b"", b"{", b"\xff", b'{"sub":"u1","sub":"ada"}'),
                    # What json reads and orjson refuses (edge/tokens.py falls back to json).
                    b'{"sub":"u1","exp":1800000060,"x":"\xed\xa0\x80"}',  # a surrogate in UTF-8
                    b'{"sub":"u1","exp":1800000060,"x":"\\udead"}',
                    b'{"sub":"u1","exp":1800000060.5,"nbf":-Infinity,"iat":1e400}',
                    b'{"sub":"u1","exp":1800000060,"x":18446744073709551616}',  # an int beyond 64 bits
                ]
            )
            | st.binary(max_size=12)
            | json_values.map(lambda v: json.dumps(v).encode())
        )
    text = json.dumps(claims, separators=None if kind == "spaced" else (",", ":"))
    return {"utf-16": text.encode("utf-16"), "bom": text.encode("utf-8-sig")}.get(kind, text.encode())


@st.composite
def tokens(draw: st.DrawFn) -> str:
    # Half the tokens carry the plain header (the fast path), half another one (parsed).
    header = (
        plain_header
        if draw(st.booleans())
        else draw(
            edited(st.just({"alg": "HS256", "typ": "JWT"}), HEADER).map(lambda h: json.dumps(h).encode())
            | st.sampled_from(
                [b"[]", b"", b"{}", b'{"alg":"HS256","alg":"none"}', b'{"alg":"none","alg":"HS256"}']
            )
        )
    )
    key = draw(st.sampled_from([SECRET, DEMO, OTHER]))
    digest = draw(st.sampled_from(["sha256", "sha256", "sha256", "sha512"]))
    token = signed(header, draw(payload_bytes()), key, digest, pad=draw(st.booleans()))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        token = draw(mutations(token))
    return token


@st.composite
def mutations(draw: st.DrawFn, token: str) -> str:
    kind = draw(st.sampled_from(["char", "insert", "delete", "segments", "bit", "bit", "tail", "replace"]))
    at = draw(st.integers(min_value=0, max_value=len(token)))
    char = draw(st.sampled_from([*"AQgwBRhx_-=.+/ ", "\x00", "é", "\ud800"]) | st.characters())
    if kind == "char" and at < len(token):
        return token[:at] + char + token[at + 1 :]
    if kind == "insert":
        return token[:at] + char + token[at:]
    if kind == "delete":
        return token[:at] + token[at + 1 :]
    parts = token.split(".")
    if kind == "segments":  # one too many, one too few, an empty one
        return draw(
            st.sampled_from([token + ".", token + ".e30", ".".join(parts[:2]), token + "=", "." + token])
        )
    if len(parts) != 3:
        return token
    i = draw(st.integers(min_value=0, max_value=2))
    try:
        data = base64.urlsafe_b64decode(parts[i] + "==")
    except ValueError:
        return token
    if kind == "bit" and data:  # one bit of the header, payload or signature, well encoded
        bit = draw(st.integers(min_value=0, max_value=len(data) * 8 - 1))
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        parts[i] = seg(bytes(flipped))
    elif kind == "tail" and parts[i]:  # the same bytes spelt another way (stray low bits)
        parts[i] = parts[i][:-1] + draw(st.sampled_from("AQgwBRhxCSiy"))
    else:  # a segment replaced, the others kept
        parts[i] = seg(draw(st.binary(max_size=16)), pad=draw(st.booleans()))
    return ".".join(parts)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(token=tokens(), demo_key=st.sampled_from([None, DEMO]))
def test_hand_verifier_takes_pyjwts_decisions(token: str, demo_key: str | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert verified(token, SECRET, demo_key) == reference(token, SECRET, demo_key)


@settings(max_examples=300, deadline=None)
@given(claims=claims_dicts, demo_key=st.sampled_from([None, DEMO]), data=st.data())
def test_random_claims_and_one_mutation_agree(
    claims: dict[str, object], demo_key: str | None, data: st.DataObject
) -> None:
    """Tokens with the plain header (the fast path), mostly signed with the key their `sub` calls
    for so that many are accepted, then once mutated."""
    sub = claims.get("sub")
    right = DEMO if isinstance(sub, str) and sub.startswith("demo:") else SECRET
    key = data.draw(st.sampled_from([right, right, right, OTHER, DEMO if right == SECRET else SECRET]))
    token = signed(plain_header, json.dumps(claims).encode(), key)
    assert verified(token, SECRET, demo_key) == reference(token, SECRET, demo_key)
    mutated = data.draw(mutations(token))
    assert verified(mutated, SECRET, demo_key) == reference(mutated, SECRET, demo_key)


@pytest.mark.parametrize("key", [SECRET, DEMO])
def test_every_bit_of_a_valid_token_counts(key: str) -> None:
    """Each single bit changed in the header, payload or signature of an accepted token (spelt in
    canonical base64url) gets it refused; and each other spelling of a segment's last character
    is judged as PyJWT judges it (the same bytes with stray low bits are refused)."""
    claims = {"sub": "demo:ada" if key == DEMO else "u1", "exp": int(T0) + 60}
    token = signed(plain_header, json.dumps(claims).encode(), key)
    assert verified(token, SECRET, DEMO) == reference(token, SECRET, DEMO) == claims["sub"]
    parts = token.split(".")
    for i, part in enumerate(parts):
        data = base64.urlsafe_b64decode(part + "==")
        for bit in range(len(data) * 8):
            flipped = bytearray(data)
            flipped[bit // 8] ^= 1 << (bit % 8)
            forged = ".".join([*parts[:i], seg(bytes(flipped)), *parts[i + 1 :]])
            assert verified(forged, SECRET, DEMO) is None
            assert reference(forged, SECRET, DEMO) is None
        for last in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_":
            respelt = ".".join([*parts[:i], part[:-1] + last, *parts[i + 1 :]])
            assert verified(respelt, SECRET, DEMO) == reference(respelt, SECRET, DEMO)


def test_the_properties_see_acceptances() -> None:
    """The properties above would pass vacuously if every token were refused: these are accepted
    by both, through the plain header and through a parsed one."""
    claims = {"sub": "u1", "exp": int(T0) + 60}
    for token in (
        signed(plain_header, json.dumps(claims).encode(), SECRET),
        signed(b'{"typ":"JWT","alg":"HS256","kid":"k1"}', json.dumps(claims).encode(), SECRET, pad=True),
        signed(b'{"alg":"HS256","b64":true,"crit":["b64"]}', json.dumps(claims).encode("utf-16"), SECRET),
        signed(plain_header, b'{"sub":"u1","exp":1800000060,"iat":NaN,"x":"\\ud800"}', SECRET),
    ):
        assert verified(token, SECRET, None) == reference(token, SECRET, None) == "u1"
    demo = signed(plain_header, json.dumps({"sub": "demo:ada", "exp": int(T0) + 60}).encode(), DEMO)
    assert verified(demo, SECRET, DEMO) == reference(demo, SECRET, DEMO) == "demo:ada"


def test_the_plain_header_is_what_mint_token_writes() -> None:
    """Tokens from `presence token` take the fast path (no header parsing)."""
    from edge.tokens import _PLAIN_HEADERS

    assert mint_token("u1", SECRET, now=T0).split(".")[0] in _PLAIN_HEADERS
    assert seg(plain_header) in _PLAIN_HEADERS


@pytest.mark.parametrize(
    "secret",
    ["", "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----", '{"kty":"oct","k":"c2VjcmV0"}'],
)
def test_keys_pyjwt_refuses_are_refused(secret: str) -> None:
    """PyJWT's key rules still hold: an empty key or one shaped like an asymmetric key or a JWK
    verifies nothing, and the demo key is not tried instead."""
    token = signed(plain_header, json.dumps({"sub": "demo:ada", "exp": int(T0) + 60}).encode(), DEMO)
    assert reference(token, secret, DEMO) is None
    with pytest.raises(TokenError, match="bad token") as e:
        verify_token(token, secret, now=T0, demo_key=DEMO)
    assert secret == "" or secret not in str(e.value)
