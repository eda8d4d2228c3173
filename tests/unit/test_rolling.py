"""The rolling restart's order and waits (cluster/rolling.py), on fake edges and a fake clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.drain import DrainRefused, Health
from cluster.rolling import Roll, Target, targets_of_cluster_file, token_from_env_file

ROOT = Path(__file__).resolve().parents[2]


class FakeEdges:
    """Edges that drain for `stop_s`, stay down for `down_s` (the supervisor's pause and the
    start), then answer as a new process; `never_back` ones never do."""

    def __init__(self, urls: list[str], stop_s: float = 3.0, down_s: float = 5.0) -> None:
        self.now = 0.0
        self.ids = {u: f"{u}#0" for u in urls}
        self.drained_at: dict[str, float] = {}
        self.stop_s, self.down_s = stop_s, down_s
        self.never_back: set[str] = set()
        self.log: list[tuple[float, str, str]] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def probe(self, url: str) -> Health:
        at = self.drained_at.get(url)
        if at is None:
            return Health(200, self.ids[url])
        if self.now < at + self.stop_s:
            return Health(503, self.ids[url], draining=True)
        if self.now < at + self.stop_s + self.down_s or url in self.never_back:
            return Health(None)
        n = int(self.ids[url].rsplit("#", 1)[1]) + 1
        self.ids[url] = f"{url}#{n}"
        del self.drained_at[url]
        self.log.append((self.now, "up", url))
        return Health(200, self.ids[url])

    def drain(self, url: str, token: str | None) -> dict[str, Any]:
        assert token == "tok"
        # At most one edge out of the balancer at any moment.
        assert not self.drained_at, f"{url} drained while {list(self.drained_at)} was still out"
        self.drained_at[url] = self.now
        self.log.append((self.now, "drain", url))
        return {"edge": self.ids[url], "sockets": 10, "graceS": 1.0, "windowS": 2.0}


def roll(edges: FakeEdges, **kwargs: Any) -> tuple[Roll, list[str]]:
    said: list[str] = []
    fakes = {"probe": edges.probe, "drain": edges.drain, "sleep": edges.sleep, "clock": edges.clock}
    r = Roll("tok", say=said.append, **fakes, **kwargs)
    return r, said


def test_one_edge_at_a_time_each_back_before_the_next() -> None:
    urls = ["http://w1:8766", "http://w2:8766", "http://h:8766"]
    edges = FakeEdges(urls)
    r, said = roll(edges)
    assert r.run([Target(u, u) for u in urls]) == 0
    assert [(kind, url) for _, kind, url in edges.log] == [
        ("drain", urls[0]),
        ("up", urls[0]),
        ("drain", urls[1]),
        ("up", urls[1]),
        ("drain", urls[2]),
        ("up", urls[2]),
    ]
    assert all(edges.ids[u].endswith("#1") for u in urls)
    assert said[-1].startswith("rolling restart done: 3 edges")


def test_an_edge_that_does_not_come_back_stops_the_roll() -> None:
    urls = ["http://w1:8766", "http://w2:8766"]
    edges = FakeEdges(urls)
    edges.never_back.add(urls[0])
    r, said = roll(edges, start_timeout_s=30.0)
    assert r.run([Target(u, u) for u in urls]) == 1
    assert [kind for _, kind, _ in edges.log] == ["drain"]  # the second one untouched
    assert "no healthy edge after 30 s" in said[-2]


def test_an_unhealthy_edge_is_left_alone() -> None:
    edges = FakeEdges(["http://w1:8766"])
    edges.drained_at["http://w1:8766"] = -100.0
    edges.never_back.add("http://w1:8766")
    r, said = roll(edges)
    assert r.run([Target("w1", "http://w1:8766")]) == 1
    assert "not healthy" in said[0]


def test_an_edge_too_busy_to_answer_for_a_while_is_waited_for_before_its_restart() -> None:
    """The edge just restarted sent its clients to the others: one of them, busy taking them,
    missed a probe, and the roll stopped there with the rest untouched (bench rollout)."""
    urls = ["http://w1:8766", "http://w2:8766"]
    edges = FakeEdges(urls)
    busy_until = 20.0
    probe = edges.probe

    def busy_probe(url: str) -> Health:
        return Health(None) if url == urls[1] and edges.now < busy_until else probe(url)

    said: list[str] = []
    r = Roll(
        "tok", probe=busy_probe, drain=edges.drain, sleep=edges.sleep, clock=edges.clock, say=said.append
    )
    assert r.run([Target(u, u) for u in urls]) == 0
    assert [(kind, url) for _, kind, url in edges.log][2] == ("drain", urls[1])
    assert edges.log[2][0] >= busy_until


def test_a_draining_edge_too_busy_to_answer_is_not_taken_for_stopped() -> None:
    """Its /healthz timed out while it closed thousands of sockets (bench rollout): the roll said
    "stopped after 10.1 s" of a drain that lasted 34 s. Only a refused connection or another
    process answering is a stop."""
    url = "http://w1:8766"
    edges = FakeEdges([url], stop_s=30.0)
    probe = edges.probe

    def busy_while_draining(u: str) -> Health:
        at = edges.drained_at.get(u)
        if at is not None and at + 5.0 <= edges.now < at + 25.0:
            return Health(None, busy=True)
        return probe(u)

    said: list[str] = []
    r = Roll(
        "tok", probe=busy_while_draining, drain=edges.drain, sleep=edges.sleep, clock=edges.clock,
        say=said.append,
    )  # fmt: skip
    assert r.run([Target("w1", url)]) == 0
    stopped = next(line for line in said if "stopped after" in line)
    assert float(stopped.split("stopped after ")[1].split(" s")[0]) >= 30.0, stopped


def test_a_refused_drain_stops_the_roll() -> None:
    edges = FakeEdges(["http://w1:8766"])

    def refuse(url: str, token: str | None) -> dict[str, Any]:
        raise DrainRefused("the edge at http://w1:8766 refused the internal token")

    r, said = roll(edges)
    r.drain = refuse
    assert r.run([Target("w1", "http://w1:8766")]) == 1
    assert "refused the internal token" in said[0]


def test_the_cluster_file_names_workers_then_the_head() -> None:
    targets = targets_of_cluster_file(ROOT / "ray_cluster.yaml")
    assert [t.url for t in targets] == [
        "http://10.0.0.11:8766",
        "http://10.0.0.12:8766",
        "http://10.0.0.10:8766",
    ]
    assert targets[-1].name.startswith("head")


def test_the_token_from_presence_env(tmp_path: Path) -> None:
    env = tmp_path / "presence.env"
    env.write_text("PRESENCE_DATABASE_URL=postgresql://x\nPRESENCE_INTERNAL_TOKEN='abc'\n")
    assert token_from_env_file(env) == "abc"
    assert token_from_env_file(tmp_path / "missing.env") is None


def test_presence_drain_waits_through_a_time_out_until_the_edge_is_gone() -> None:
    """`presence drain` waits with `wait_gone`: a probe timing out is a busy edge, not a gone one."""
    from cluster.drain import wait_gone

    answers = [
        Health(503, "e1", draining=True),
        Health(None, busy=True),
        Health(None, busy=True),
        Health(None),
    ]
    slept: list[float] = []
    assert wait_gone("http://w1:8766", "e1", 60.0, probe=lambda _u: answers.pop(0), sleep=slept.append)
    assert not answers and len(slept) == 3


def test_a_data_dir_without_its_token_is_a_usage_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cluster import rolling

    with pytest.raises(SystemExit) as e:
        rolling.main(["--data-dir", str(tmp_path), "--edge", "http://127.0.0.1:1"])
    assert e.value.code == 2
    assert "--data-dir: cannot read its internal-token" in capsys.readouterr().err
