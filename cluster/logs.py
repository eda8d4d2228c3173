"""One log level and one log format for every process of the service.

`PRESENCE_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR) and `PRESENCE_LOG_JSON` (one JSON object a
line) apply to the command's own process (the edge of `presence up` and `presence edge`) through
`configure`, and to the Ray actors it starts (shards, FlushActor, slot directory) through
`ray.LoggingConfig` (`ray_logging_config`), whose JSON lines carry the same keys (`asctime`,
`levelname`, `name`, `message`) plus Ray's own (job, worker, node, actor ids).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: asctime, levelname, name, message, process (and exc_text)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "asctime": self.formatTime(record),
            "levelname": record.levelname,
            "name": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "filename": record.filename,
            "lineno": record.lineno,
        }
        if record.exc_info:
            entry["exc_text"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str = "WARNING", json_lines: bool = False) -> None:
    """This process's root logger: one handler on stderr, the given level and format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def ray_logging_config(level: str, json_lines: bool) -> Any:
    """The same choice for every Ray worker of the job (shards, FlushActor, directory)."""
    import ray

    return ray.LoggingConfig(encoding="JSON" if json_lines else "TEXT", log_level=level)
