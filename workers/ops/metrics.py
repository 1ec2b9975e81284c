"""The Prometheus metrics each worker process records (prometheus-client).

How a worker serves them, summed over its pool's processes, is workers/ops/multiproc.py's.

Names follow Prometheus' conventions: `utxoflow_` prefix, base units (`_seconds`), `_total`
for counters. What the whole deployment holds (tip, lag, queues, pending messages, pruner and
recovery state) is not here: it is read at scrape time by `utxo metrics` (workers/ops/cluster.py),
so that N workers do not report it N times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import Counter, Histogram

from stores.errors import ProcessingError, StorageError, StoreError
from stores.state.prunejobs import CANCELLED, COMPLETED, FAILED
from stores.state.recovery import DONE, KINDS, PENDING, TERMINAL

# a block phase of a 2,000-tx block takes tens of milliseconds; a 100,000-tx block, seconds
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

BLOCKS_APPLIED = Counter("utxoflow_blocks_applied_total", "Blocks applied to the best chain.")
BLOCKS_REFUSED = Counter("utxoflow_blocks_refused_total", "Blocks refused as invalid.")
BLOCKS_DISCONNECTED = Counter(
    "utxoflow_blocks_disconnected_total", "Blocks taken off the best chain by a reorg or a rebase."
)
TXS_APPLIED = Counter(
    "utxoflow_txs_applied_total", "Transactions applied: in blocks, or accepted into the mempool.",
    ["source"],
)
MEMPOOL_TXS = Counter(
    "utxoflow_mempool_txs_total", "Mempool transaction tasks by outcome.", ["outcome"]
)
BLOCK_SECONDS = Histogram(
    "utxoflow_block_apply_seconds", "Time to apply one block to the UTXO store.", buckets=PHASE_BUCKETS
)
PHASE_SECONDS = Histogram(
    "utxoflow_block_phase_seconds", "Time of one phase of applying a block.", ["phase"],
    buckets=PHASE_BUCKETS,
)
PRUNER_JOBS = Counter("utxoflow_pruner_jobs_total", "Pruner runs by final status.", ["status"])
PRUNER_RECORDS = Counter(
    "utxoflow_pruner_records_deleted_total", "Records deleted by the pruner."
)
PRUNER_BLOBS = Counter("utxoflow_pruner_blobs_deleted_total", "External blobs deleted by the pruner.")
PRUNER_SECONDS = Histogram(
    "utxoflow_pruner_job_seconds", "Duration of one pruner run.", buckets=PHASE_BUCKETS
)
RECOVERY_CLAIMS = Counter(
    "utxoflow_recovery_claims_total", "Recovery claims handled, by kind and outcome.", ["kind", "outcome"]
)
BLOB_ERRORS = Counter("utxoflow_blob_errors_total", "Blob store calls that failed.", ["op"])
STORE_ERRORS = Counter(
    "utxoflow_store_errors_total", "Tasks retried or failed on a store error, by its kind.", ["kind"]
)

PHASES = ("plan", "check", "create", "reclaim", "spend", "mine")
# Every series that is known beforehand exists from the start, at 0: a rate over a series that
# is missing is "no data", not 0, and a dashboard could not tell a quiet worker from a dead one.
_KNOWN: list[tuple[Any, tuple[tuple[str, ...], ...]]] = [
    (PHASE_SECONDS, tuple((p,) for p in PHASES)),
    (TXS_APPLIED, (("block",), ("mempool",))),
    (MEMPOOL_TXS, (("accepted",), ("rejected",), ("waiting",))),
    (PRUNER_JOBS, ((COMPLETED,), (FAILED,), (CANCELLED,))),
    (RECOVERY_CLAIMS, tuple((k, o) for k in KINDS for o in (PENDING, DONE, *TERMINAL, "lost"))),
    (BLOB_ERRORS, tuple((op,) for op in ("put", "get", "exists", "delete", "list", "set_dah", "get_dah"))),
    (STORE_ERRORS, ((StorageError.code,), (ProcessingError.code,))),
]
for _metric, _labels in _KNOWN:
    for _l in _labels:
        _metric.labels(*_l)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time one phase of a block (only when it completes: a refused block's partial phase
    would pull the distribution down)."""
    t0 = time.perf_counter()
    yield
    PHASE_SECONDS.labels(name).observe(time.perf_counter() - t0)


def count_blob_error(op: str, _error: BaseException) -> None:
    BLOB_ERRORS.labels(op).inc()


def store_error(exc: BaseException) -> None:
    """Count a task's retry or failure caused by a store error (StoreError's code)."""
    if isinstance(exc, StoreError):
        STORE_ERRORS.labels(exc.code).inc()
