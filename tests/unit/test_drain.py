"""cluster/drain.py, the parts without an edge: which URL `presence drain` asks, and its exit codes
for what it could not even ask (the asking itself: tests/integration/test_drain.py)."""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

import pytest

from cluster.config import Settings
from cluster.drain import DrainUsage, drain, edge_url


@pytest.mark.parametrize("given", ["127.0.0.1:8766", "http://[::1", "ftp://host:8766", "notaurl", "http://"])
def test_what_is_no_internal_url_is_said_so(given: str) -> None:
    """Before: "the edge at notaurl did not answer (ValueError)", as if something had been tried."""
    with pytest.raises(DrainUsage, match="is not an edge's internal URL"):
        edge_url(Settings(), given)


def test_an_internal_url_is_taken_as_given() -> None:
    assert edge_url(Settings(), "http://10.0.0.5:8766/") == "http://10.0.0.5:8766"


def test_nothing_to_ask_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert drain(Settings(data_dir=tmp_path), None, wait=False) == 2
    assert drain(Settings(data_dir=tmp_path), "notaurl", wait=False) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("presence drain: ") for line in lines)


def test_an_edge_that_does_not_answer_is_said_why(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `did not answer (URLError)` whatever went wrong."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: nothing listens
    assert drain(Settings(), f"http://127.0.0.1:{port}", wait=False) == 1
    assert drain(Settings(), "http://no-such-host.invalid:8766", wait=False) == 1
    refused, unknown = capsys.readouterr().err.strip().splitlines()
    assert refused.startswith(f"presence drain: the edge at http://127.0.0.1:{port} refused the connection")
    assert "cannot resolve the host" in unknown
    assert "URLError" not in refused + unknown


def test_a_port_answering_something_else_than_json_is_said_so(capsys: pytest.CaptureFixture[str]) -> None:
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>not an edge</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert drain(Settings(), f"http://127.0.0.1:{server.server_port}", wait=False) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert "answered something that is not JSON" in capsys.readouterr().err
