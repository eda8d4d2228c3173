"""What the shard state holds only once its shell loaded it, and the error for what it did not.

The shard state (`actors.core.shard`) works on accounts, relations and channels that its shell
loads from the store before each batch (`needs()`). An operation that reaches one that was not
loaded (the store was away) raises `NotLoaded`, which the shell answers `UNAVAILABLE` (the edge
tries again). It is not a `KeyError`: a `KeyError` anywhere else is a bug, and must look like one
(logged with its traceback, the call failing), never like "presence is restarting".
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class NotLoaded(Exception):
    """An operation needed something its shell had not loaded (see the module's docstring)."""

    def __init__(self, what: str, key: object) -> None:
        super().__init__(f"{what} {key!r} is not loaded")
        self.what = what
        self.key = key


class Loaded(dict[K, V]):
    """A dict of loaded data: looking up a missing key raises `NotLoaded` instead of `KeyError`.

    Lookups of present keys are a plain dict's (only a miss calls `__missing__`); `get`, `in`,
    `del` and `pop` are unchanged."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def __missing__(self, key: K) -> V:
        raise NotLoaded(self.what, key)

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled with its items (slot exports, checkpoints of the state in tests).
        return (_rebuild, (self.what, dict(self)))


def _rebuild(what: str, items: dict[K, V]) -> Loaded[K, V]:
    out: Loaded[K, V] = Loaded(what)
    out.update(items)
    return out
