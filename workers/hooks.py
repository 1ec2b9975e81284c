"""What a worker process does at Celery's signals: take the chain up and start its recovery
threads when it is ready, note each message it receives (for the recovery manager), serve its
metrics, record its activity, count retries and failures. Imported by the worker as it starts
(`workers.runtime.app`'s include list), before any of these signals; no other process loads it, so the
app itself imports nothing above it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.signals import (
    task_failure,
    task_received,
    task_retry,
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from workers.runtime.app import app

log = logging.getLogger("utxoflow.app")


@worker_ready.connect
def resume_the_chain(**_: Any) -> None:
    """A worker starting finds the chain not at rest (a block half applied, or the best chain
    ahead of the tip: its worker died with the message, which Redis gives back only after the
    visibility timeout): it sends one block message to take it up (`resume_message`)."""
    from stores.state import open_state_store
    from workers.chainstate.sequencer import resume_message
    from workers.runtime.ingest import BLOCK_TASK, publish_known
    from workers.settings import load_settings

    try:
        state = open_state_store(load_settings().state_url, create=False)
    except Exception:
        return
    try:
        args = resume_message(state)
        if args is not None:
            log.warning("the chain is not at rest: resuming it from block %s", args[0])
            publish_known(state, BLOCK_TASK, *args)
    finally:
        state.close()


@worker_ready.connect
def start_recovery(sender: Any = None, **_: Any) -> None:
    """A worker starting sends one re-sending scan (workers/recovery/requeue.py): messages pending from
    before a broker restart are sent again now, whoever leads. Then it starts its threads
    (workers/recovery/run.py): its liveness heartbeat, and — a worker of the `recovery` queue,
    unless UTXO_RECOVERY_ENABLED is false — a recovery manager contending for the leadership,
    so that no other process (beat) is needed to recover anything."""
    from workers.recovery.run import WorkerThreads
    from workers.settings import load_settings

    settings = load_settings()
    _send_scan(settings.requeue_interval)
    consumer = getattr(sender, "task_consumer", None)
    queues = {q.name for q in getattr(consumer, "queues", None) or ()}
    manage = settings.recovery_enabled and (not queues or "recovery" in queues)
    node = str(getattr(sender, "hostname", None) or f"pid{os.getpid()}")
    global _threads
    _threads = WorkerThreads(app, settings, node, manage)


_threads: Any = None  # this worker's WorkerThreads, once it is ready


@task_received.connect
def note_taken(request: Any = None, **_: Any) -> None:
    """Each message a worker receives is noted as its own (by delivery tag), so that the
    recovery manager can give it back at once if this worker dies (workers/recovery/liveness.py)."""
    # (Celery's request keeps only some of the delivery info: the tag is the message's own)
    tag = getattr(getattr(request, "message", None), "delivery_tag", None)
    if _threads is not None and tag:
        _threads.taken(str(tag))


@worker_shutdown.connect
def stop_recovery(**_: Any) -> None:
    if _threads is not None:
        _threads.stop()


@worker_ready.connect
def serve_metrics(**_: Any) -> None:
    """A worker with UTXO_METRICS_PORT serves its processes' metrics (workers/ops/metrics.py)."""
    from workers.ops import multiproc
    from workers.settings import load_settings

    s = load_settings()
    if s.metrics_port:
        try:
            multiproc.serve(s.metrics_port, s.metrics_address)
        except OSError as e:  # (the port is taken): the worker works on, unwatched, and says so
            log.error("cannot serve metrics on %s:%d: %s", s.metrics_address, s.metrics_port, e)


@worker_init.connect
def record_activity(**_: Any) -> None:
    """A worker (its main process, before its pool forks) records what it does for the last
    minute's rates of `utxo status` (workers/ops/activity.py)."""
    from workers.ops import activity
    from workers.settings import load_settings

    activity.enable(load_settings().broker_url)


@task_retry.connect
def count_retry(reason: Any = None, **_: Any) -> None:
    from workers.chainstate.blockindex import BlockMissing
    from workers.ops import metrics

    # (Task.retry raises its Retry inside the task's `except`: the store's error is its context)
    if isinstance(reason, BaseException):
        cause = getattr(reason, "exc", None) or reason.__cause__ or reason.__context__ or reason
        if not isinstance(cause, BlockMissing):  # (a block's bytes not there yet: waited for)
            metrics.store_error(cause)


@task_failure.connect
def count_failure(exception: Any = None, **_: Any) -> None:
    from workers.ops import metrics
    from workers.runtime.outcome import Refused

    # (a refusal is the task's verdict, counted with the blocks or transactions refused)
    if isinstance(exception, BaseException) and not isinstance(exception, Refused):
        metrics.store_error(exception)


@worker_process_shutdown.connect
def process_ends(pid: Any = None, **_: Any) -> None:
    """A pool child ends: what it counted is handed on (activity), its live gauges dropped."""
    from workers.ops import activity, multiproc

    activity.flush()
    multiproc.process_ended(int(pid or os.getpid()))


def _send_scan(expires: float) -> None:
    try:
        app.send_task("utxoflow.recovery.requeue", expires=expires)
    except Exception as e:  # the worker runs on: the leader's next scan re-sends anyway
        log.warning("could not send the re-sending scan: %s", e)
