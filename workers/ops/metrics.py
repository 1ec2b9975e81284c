"""The Prometheus metrics each worker process records (prometheus-client).

How a worker serves them, summed over its pool's processes, is workers/ops/multiproc.py's.

Invariants: the rest of the code records through the functions at the end of this module,
never through the metric objects, and those functions never raise — a metric that cannot be
written (a full multiprocess directory) must not fail a block that was applied. Blocks are
counted, and their phases observed, when their batch has committed (`block_applied`, from the
sequencer's commit): a batch rolled back and applied again counts once.

Names follow Prometheus' conventions: `utxoflow_` prefix, base units (`_seconds`), `_total`
for counters. What the whole deployment holds (tip, lag, queues, pending messages, pruner and
recovery state) is not here: it is read at scrape time by `utxo metrics` (workers/monitor/cluster.py),
so that N workers do not report it N times.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram

from stores.blob.observed import OPS as BLOB_OPS
from stores.errors import ProcessingError, StorageError, StoreError
from stores.state.prunejobs import CANCELLED, COMPLETED, FAILED
from stores.state.recovery import DONE, KINDS, PENDING, TERMINAL

log = logging.getLogger("utxoflow.metrics")
F = TypeVar("F", bound=Callable[..., None])

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
    "utxoflow_mempool_txs_total", "Mempool transactions by outcome: accepted (made now), "
    "known (already in the store: a redelivery), rejected; waiting: an attempt that found a parent "
    "missing, retried later (a store's error is utxoflow_store_errors_total's).", ["outcome"]
)
BLOCKS_PREPARED = Counter(
    "utxoflow_blocks_prepared_total", "Commitment deltas of blocks ahead of the chain: made by a worker "
    "that did not hold it, and taken by the holder when it applied the block "
    "(workers/chainstate/prepare.py).",
    ["event"],
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
PRUNER_SECONDS = Histogram(  # (a run may last up to UTXO_PRUNER_JOB_TIMEOUT, 600 s by default)
    "utxoflow_pruner_job_seconds", "Duration of one pruner run.", buckets=(*PHASE_BUCKETS, 300, 600, 1800)
)
RECOVERY_CLAIMS = Counter(
    "utxoflow_recovery_claims_total", "Recovery claims handled, by kind and the status the entry "
    "was left in (lost: the claim had passed to another holder).", ["kind", "status"]
)
BLOB_ERRORS = Counter("utxoflow_blob_errors_total", "Blob store calls that failed.", ["op"])
STORE_ERRORS = Counter(
    "utxoflow_store_errors_total", "Tasks retried or failed on a store error, by its kind.", ["kind"]
)

PHASES = ("plan", "check", "create", "reclaim", "spend", "mine", "commit")
# Every series that is known beforehand exists from the start, at 0: a rate over a series that
# is missing is "no data", not 0, and a dashboard could not tell a quiet worker from a dead one.
_KNOWN: list[tuple[Any, tuple[tuple[str, ...], ...]]] = [
    (PHASE_SECONDS, tuple((p,) for p in PHASES)),
    (TXS_APPLIED, (("block",), ("mempool",))),
    (MEMPOOL_TXS, (("accepted",), ("known",), ("rejected",), ("waiting",))),
    (PRUNER_JOBS, ((COMPLETED,), (FAILED,), (CANCELLED,))),
    (RECOVERY_CLAIMS, tuple((k, o) for k in KINDS for o in (PENDING, DONE, *TERMINAL, "lost"))),
    (BLOB_ERRORS, tuple((op,) for op in BLOB_OPS)),
    (STORE_ERRORS, ((StorageError.code,), (ProcessingError.code,))),
]
for _metric, _labels in _KNOWN:
    for _l in _labels:
        _metric.labels(*_l)


def _quietly(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as e:  # (see the invariants)
            log.debug("metric %s not recorded: %s", fn.__name__, e)

    return wrapper  # type: ignore[return-value]


@contextmanager
def phase(name: str, into: dict[str, float]) -> Iterator[None]:
    """Time one phase of a block into `into` (observed by `block_applied` once the block is
    committed; a phase that raises is not timed)."""
    t0 = time.perf_counter()
    yield
    into[name] = into.get(name, 0.0) + time.perf_counter() - t0


@_quietly
def block_applied(seconds: float, txs: int, phases: Mapping[str, float], prepared: bool = False) -> None:
    BLOCKS_APPLIED.inc()
    if prepared:
        BLOCKS_PREPARED.labels("taken").inc()
    TXS_APPLIED.labels("block").inc(txs)
    BLOCK_SECONDS.observe(seconds)
    for name, s in phases.items():
        PHASE_SECONDS.labels(name).observe(s)


@_quietly
def blocks_prepared(n: int) -> None:
    BLOCKS_PREPARED.labels("made").inc(n)


@_quietly
def blocks_refused(n: int = 1) -> None:
    BLOCKS_REFUSED.inc(n)


@_quietly
def block_disconnected() -> None:
    BLOCKS_DISCONNECTED.inc()


@_quietly
def mempool_tx(outcome: str, n: int = 1) -> None:
    if not n:
        return
    MEMPOOL_TXS.labels(outcome).inc(n)
    if outcome == "accepted":
        TXS_APPLIED.labels("mempool").inc(n)


@_quietly
def prune_run(status: str, figures: Mapping[str, Any]) -> None:
    """A run's figures (records its chunk helpers deleted included: the job's figures sum theirs)."""
    delete = figures.get("delete") or {}
    PRUNER_JOBS.labels(status).inc()
    PRUNER_RECORDS.inc(int(delete.get("deleted", 0)))
    PRUNER_BLOBS.inc(int(delete.get("blobs_deleted", 0)))
    PRUNER_SECONDS.observe(float(figures.get("seconds", 0.0)))


@_quietly
def recovery_claim(kind: str, status: str) -> None:
    RECOVERY_CLAIMS.labels(kind, status).inc()


@_quietly
def count_blob_error(op: str, _error: BaseException) -> None:
    BLOB_ERRORS.labels(op).inc()


@_quietly
def store_error(exc: BaseException) -> None:
    """Count a task's retry or failure caused by a store error (StoreError's code)."""
    if isinstance(exc, StoreError):
        STORE_ERRORS.labels(exc.code).inc()
