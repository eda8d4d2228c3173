"""Unit-suite fixtures: no Ray, an injectable clock.

The unit suite tests pure code (the shard core, the session, the frame models). Anything that
reaches for Ray here is a layering bug, so `ray.init` is replaced by a function that raises: the
test fails loudly instead of quietly starting a cluster (and taking seconds to do it).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.unit.edges_sim import edges  # noqa: F401  (a fixture: what the edges deliver)

T0 = 1_800_000_000.0  # an epoch time in 2027, far from the real clock on purpose

_RAY_AVAILABLE = importlib.util.find_spec("ray") is not None


class RayForbidden(RuntimeError):
    """Raised by `ray.init` inside the unit suite."""


def _refuse_ray(*args: object, **kwargs: object) -> None:
    raise RayForbidden("unit tests must not start or join Ray; put this test under tests/integration")


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if _RAY_AVAILABLE:
        import ray

        monkeypatch.setattr(ray, "init", _refuse_ray)
    yield


@dataclass
class Clock:
    """A hand-driven clock: `clock()` is the current time, `clock.advance(s)` moves it on."""

    now: float = T0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        assert seconds >= 0, "this clock only moves forwards; set `now` for a jump back"
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()
