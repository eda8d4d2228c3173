"""One log level and format for every process (cluster/logs.py): JSON lines parse, the level
comes from PRESENCE_LOG_LEVEL in any case, and Ray's actors get the same through LoggingConfig."""

from __future__ import annotations

import json
import logging

import pytest

from cluster import logs
from cluster.config import SettingsError, load_settings


def test_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO", json_lines=True)
    try:
        logging.getLogger("presence.test").info("hello %s", "there")
        logging.getLogger("presence.test").debug("not shown")
    finally:
        logs.configure("WARNING", json_lines=False)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 1
    assert lines[0]["message"] == "hello there" and lines[0]["levelname"] == "INFO"
    assert lines[0]["name"] == "presence.test"


def test_level_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRESENCE_LOG_LEVEL", "debug")
    monkeypatch.setenv("PRESENCE_LOG_JSON", "true")
    settings = load_settings()
    assert settings.log_level == "DEBUG" and settings.log_json is True
    monkeypatch.setenv("PRESENCE_LOG_LEVEL", "loud")
    with pytest.raises(SettingsError, match="PRESENCE_LOG_LEVEL="):
        load_settings()


def test_ray_actors_get_the_same_choice() -> None:
    config = logs.ray_logging_config("INFO", True)
    assert config.encoding == "JSON" and config.log_level == "INFO"
    assert logs.ray_logging_config("ERROR", False).encoding == "TEXT"
