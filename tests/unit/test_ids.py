"""The id rule (protocol.md "The id rule"), one implementation for frames, tokens, the internal API
and `presence load`: 1-128 characters, no Cc/Cf/Cs code point, no U+2028/U+2029."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.ids import MAX_ID_LENGTH, check_id, id_problem, is_demo_id

FORBIDDEN = ("Cc", "Cf", "Cs")


def reference(value: str) -> bool:
    """The rule as the contract states it, spelled out character by character."""
    return 1 <= len(value) <= 128 and all(
        unicodedata.category(c) not in FORBIDDEN and c not in "\u2028\u2029" for c in value
    )


@pytest.mark.parametrize(
    "good", ["u1", "a" * 128, "é" * 128, "Ada Lovelace", "user@example.com", "日本語", "emoji-🙂", "a b"]
)
def test_valid(good: str) -> None:
    assert id_problem(good) is None
    assert check_id(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "a" * 129,
        "a\x00b",  # NUL
        "a\nb",
        "a\x7fb",  # DEL
        "a\x85b",  # NEL (C1)
        "a\u2028b",  # line separator
        "a\u2029b",  # paragraph separator
        "a\u200bb",  # zero-width space (Cf)
        "a\u200db",  # zero-width joiner
        "admin\u202enimda",  # right-to-left override
        "a\u2066b",  # left-to-right isolate
        "\ufeffa",  # BOM
        "a\u00adb",  # soft hyphen
        "a\U000e0041",  # tag character
        "a\ud800b",  # lone surrogate
        "\udfff",
    ],
)
def test_invalid(bad: str) -> None:
    assert id_problem(bad) is not None
    with pytest.raises(ValueError):
        check_id(bad)


@pytest.mark.parametrize("value", [None, 42, b"u1", ["u1"]])
def test_not_a_string(value: object) -> None:
    assert id_problem(value) == "an id must be a string"


def test_message_names_the_code_point_not_the_id() -> None:
    problem = id_problem("secret\u202ename")
    assert problem is not None and "U+202E" in problem and "position 6" in problem
    assert "secret" not in problem
    assert str(MAX_ID_LENGTH) in (id_problem("x" * 3000) or "")


@given(st.text(max_size=140))
def test_agrees_with_the_stated_rule(value: str) -> None:
    assert (id_problem(value) is None) == reference(value)


@given(
    st.text(min_size=1, max_size=60),
    st.sampled_from(["\u200b", "\u202e", "\x00", "\u2028", "\ud83d", "\x9f", "\U000e0001"]),
    st.text(max_size=60),
)
def test_one_forbidden_character_anywhere_spoils_it(prefix: str, bad: str, suffix: str) -> None:
    assert id_problem(prefix + bad + suffix) is not None


ALLOWED = st.characters(codec="utf-8", exclude_categories=FORBIDDEN, exclude_characters="\u2028\u2029")


@given(st.text(ALLOWED, min_size=1, max_size=128))
def test_everything_else_passes(value: str) -> None:
    assert id_problem(value) is None


def test_demo_namespace() -> None:
    assert is_demo_id("demo:ada") and not is_demo_id("ada") and not is_demo_id("demo")
