"""Log lines as JSON objects, one per line (UTXO_LOG_JSON=1), so that a log shipper takes them
as they are: time, level, logger, process, message, and the fields a line carries
(`extra=`: block hash, height, phase, duration, per-phase seconds…), plus the Celery task's name and id when a
task logged it. Without the setting nothing changes: Celery's own format, for a person."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# a LogRecord's own attributes: anything else on a record came from a log call's `extra`
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
            "message": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STANDARD and k not in obj:
                obj[k] = v
        task = _task()
        if task is not None:
            obj["task"], obj["task_id"] = task
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str)


def _task() -> tuple[str, str] | None:
    try:
        from celery._state import get_current_task
    except ImportError:  # (not in a worker)
        return None
    t = get_current_task()
    if t is None or t.request.id is None:
        return None
    return str(t.name), str(t.request.id)


def use_json(logger: logging.Logger) -> None:
    """Every handler of `logger` writes JSON lines from now on."""
    for h in logger.handlers:
        h.setFormatter(JsonFormatter())
