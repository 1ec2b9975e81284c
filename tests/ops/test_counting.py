"""The pieces behind the metrics and `utxo status`, each against the real thing it watches: a
blob store that really fails, a real Redis (a database claimed for the test), Celery's own
retry signal, and log records through the JSON formatter."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from stores.blob import BlobNotFound, open_blob_store
from stores.blob.observed import on_error
from stores.errors import StorageError
from workers.localredis import claim_database
from workers.ops import activity
from workers.ops.logs import JsonFormatter
from workers.ops.metrics import count_blob_error, store_error


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_blob_store_failures_are_counted_by_operation_and_a_missing_blob_is_not(tmp_path: Path) -> None:
    seen: list[tuple[str, StorageError]] = []
    on_error(lambda op, e: seen.append((op, e)))
    on_error(count_blob_error)
    blobs = open_blob_store(f"file://{tmp_path}/blobs")
    key = "ab/" + "ab" * 32 + ".tx"
    (tmp_path / "blobs" / "ab").write_bytes(b"a file where the fan-out directory goes")
    before = sample("utxoflow_blob_errors_total", op="put")
    with pytest.raises(StorageError):
        blobs.put_if_absent(key, b"data")
    assert [op for op, _e in seen] == ["put"]
    assert sample("utxoflow_blob_errors_total", op="put") == before + 1
    with pytest.raises(BlobNotFound):  # an answer, not a failure
        blobs.get("cd/" + "cd" * 32 + ".tx")
    assert [op for op, _e in seen] == ["put"]
    blobs.put_if_absent("cd/" + "cd" * 32 + ".tx", b"ok")  # the store itself still works
    assert blobs.get("cd/" + "cd" * 32 + ".tx") == b"ok"


def test_a_task_retried_on_a_store_error_counts_the_error_by_its_code() -> None:
    """Celery's task_retry signal carries the Retry, raised inside the task's `except`: the
    store's error is what is counted (tasks/blocks.py retries exactly so)."""
    from celery.exceptions import Retry

    from workers.app import count_retry

    before = sample("utxoflow_store_errors_total", kind="STORAGE_ERROR")
    try:
        try:
            raise StorageError("the database went away")
        except StorageError:
            raise Retry("again") from None
    except Retry as r:
        reason = r
    assert reason.__context__ is not None  # (`from None` hides it from tracebacks only)
    count_retry(reason=reason)
    count_retry(reason=Retry("not a store's"))
    assert sample("utxoflow_store_errors_total", kind="STORAGE_ERROR") == before + 1
    store_error(ValueError("not a store error"))
    assert sample("utxoflow_store_errors_total", kind="STORAGE_ERROR") == before + 1


def test_json_log_lines_carry_the_fields_a_line_was_given() -> None:
    rec = logging.LogRecord("utxoflow.sequencer", logging.INFO, __file__, 1, "applied block %s", ("ab",),
                            None)
    rec.__dict__.update(block="ab" * 32, height=7, phase="applied", duration_s=0.25, txs=3)
    obj = json.loads(JsonFormatter().format(rec))
    assert obj["message"] == "applied block ab" and obj["level"] == "INFO"
    assert obj["logger"] == "utxoflow.sequencer" and obj["ts"].endswith("+00:00")
    assert {k: obj[k] for k in ("block", "height", "phase", "duration_s", "txs")} == {
        "block": "ab" * 32, "height": 7, "phase": "applied", "duration_s": 0.25, "txs": 3,
    }
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exc"]


@pytest.fixture
def broker() -> Iterator[str]:
    claimed = claim_database("redis://127.0.0.1:6379/0")
    try:
        yield claimed.url
    finally:
        claimed.release()


def test_activity_from_two_processes_adds_up_and_old_seconds_go(broker: str) -> None:
    """Counts from several writers add up per second; the window sums the seconds inside it
    (not the one still counting); seconds older than KEEP_S are removed by the next writer."""
    r = redis.Redis.from_url(broker)
    now = int(time.time())
    r.hset(activity.KEY + "blocks", str(now - activity.KEEP_S - 5), 99)  # a stale second
    a, b = activity.Activity(broker), activity.Activity(broker)
    a.note("blocks", 2)
    b.note("blocks", 3)
    b.note("mempool_txs", 7)
    a.flush()
    b.flush()
    fields = {int(k): int(v) for k, v in r.hgetall(activity.KEY + "blocks").items()}
    assert sum(fields.values()) == 5 and min(fields) >= now - 1  # the stale one is gone
    later = max(fields) + 1
    got = activity.rates(r, 60, now=later)
    assert got["blocks"] == pytest.approx(5 / 60) and got["mempool_txs"] == pytest.approx(7 / 60)
    assert activity.rates(r, 60, now=later + 61)["blocks"] == 0  # out of the window
    assert activity.rates(r, 60, now=max(fields))["blocks"] == 0  # the second still counting
