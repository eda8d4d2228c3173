"""`presence load` applies the id rule (an error naming the entry) and keeps the demo's reserved
namespace for the demo."""

from __future__ import annotations

import pytest

from cluster.db import FixtureError, parse_fixture


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"users": [{"id": "ok"}, {"id": "a\u200bb"}]}, "users[1].id"),
        ({"users": [{"id": "x" * 129}]}, "users[0].id"),
        ({"friendships": [["ok", "admin\u202e"]]}, "friendships[0][1]"),
        ({"servers": [{"id": "g\x00"}]}, "servers[0].id"),
        ({"servers": [{"id": "g", "members": ["u1", "u\u2028"]}]}, "servers[0].members[1]"),
        ({"servers": [{"id": "g", "channels": ["\ufeffc"]}]}, "servers[0].channels[0]"),
    ],
)
def test_ids_breaking_the_rule_are_named(data: dict[str, object], where: str) -> None:
    with pytest.raises(FixtureError) as caught:
        parse_fixture(data)
    assert where in str(caught.value)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"users": [{"id": "demo:ada"}]}, "users[0].id"),
        ({"servers": [{"id": "demo:server"}]}, "servers[0].id"),
        ({"servers": [{"id": "g", "members": ["u1", "demo:ken"]}]}, "servers[0].members[1]"),
        ({"friendships": [["demo:grace", "u1"]]}, "friendships[0][0]"),
    ],
)
def test_demo_namespace_is_reserved(data: dict[str, object], where: str) -> None:
    with pytest.raises(FixtureError, match="reserved for the demo") as caught:
        parse_fixture(data)
    assert where in str(caught.value)
    assert parse_fixture(data, allow_demo=True)


def test_demo_word_alone_is_an_ordinary_id() -> None:
    assert parse_fixture({"servers": [{"id": "demo", "members": ["ada"]}]}).servers[0].id == "demo"
