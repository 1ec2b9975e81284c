"""The pieces behind the metrics and `utxo status`, each against the real thing it watches: a
blob store that really fails, a real Redis (a database claimed for the test), Celery's own
retry signal, and log records through the JSON formatter."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from stores.blob import BlobNotFound, open_blob_store
from stores.blob.observed import off_error, on_error
from stores.errors import StorageError
from tests.conftest import REDIS
from workers.demo.localredis import claim_database
from workers.ops import activity
from workers.ops.logs import JsonFormatter
from workers.ops.metrics import count_blob_error, store_error


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_blob_store_failures_are_counted_by_operation_and_a_missing_blob_is_not(tmp_path: Path) -> None:
    seen: list[tuple[str, StorageError]] = []

    def listen(op: str, e: StorageError) -> None:
        seen.append((op, e))

    def broken(_op: str, _e: StorageError) -> None:
        raise RuntimeError("a listener that fails must not replace the store's error")

    for listener in (listen, broken, count_blob_error):
        on_error(listener)
    try:
        _blob_failures(tmp_path, seen)
    finally:
        for listener in (listen, broken, count_blob_error):
            off_error(listener)


def _blob_failures(tmp_path: Path, seen: list[tuple[str, StorageError]]) -> None:
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

    from workers.hooks import count_retry

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
    claimed = claim_database(f"{REDIS}/0")
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
    r.hset(activity.KEY + "blocks", "not-a-second", 5)  # someone else's field: left alone, not fatal
    assert activity.rates(r, 60, now=later)["blocks"] == pytest.approx(5 / 60)


def test_activity_across_a_fork_counts_each_process_once(broker: str) -> None:
    """A process that counted and then forks (Celery's prefork pool): the child starts with
    nothing of the parent's, and a lock of its own (the parent's thread may hold the parent's
    at the fork); nothing is counted twice. Without `enable`, nothing is recorded at all."""
    r = redis.Redis.from_url(broker)
    activity.note("blocks", 100)  # not enabled in this process: recorded nowhere
    assert not r.exists(activity.KEY + "blocks")
    activity.enable(broker)
    try:
        activity.note("blocks", 5)
        parent = activity._activity
        pid = os.fork()
        if pid == 0:  # the child: a count of its own, flushed, and out
            ok = activity._activity is not parent and activity._activity is not None
            activity.note("blocks", 1)
            activity.flush()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        activity.flush()
        assert sum(int(v) for v in r.hgetall(activity.KEY + "blocks").values()) == 6
    finally:
        activity._url = activity._activity = None  # (this test process records nothing more)
