"""Pruner tasks (queue `prune`): a run of the job manager, and the helpers that delete chunks of a
run where the store takes concurrent writers (workers/pruning/pruner.py, workers/pruning/prunerun.py)."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from stores.errors import StorageError
from workers.runtime.app import app
from workers.runtime.services import services

log = logging.getLogger("utxoflow.tasks")
LOCK_RETRIES = 20  # looks at a held lock, a lease apart, before leaving the job to the next request


@app.task(name="utxoflow.prune.run", bind=True, max_retries=LOCK_RETRIES)
def prune_run(self: Task) -> dict[str, Any]:
    """Take and run pruning jobs until the slot is empty (or another worker holds the lock).
    Safe at any time, on any number of workers at once; redelivered after its worker died, it
    fails the dead job and runs its height again. When it ran nothing while a job waits and the
    lock is held — by a runner that may have died on another host, which only its lease's
    expiry can tell — it looks again a lease later (a few times: a live runner takes the
    waiting job itself)."""
    svc = services()
    try:
        jobs = svc.pruner.drive()
        running, pending = svc.state.prune_open_jobs() if not jobs else (None, None)
    except StorageError as e:  # a store is down: the job waits in the slot for the next request
        log.warning("the prune run is skipped: %s", e)
        return {"skipped": str(e)}
    if pending is not None and running is not None:
        raise self.retry(countdown=svc.pruner.config.lease_s)
    return {"jobs": [j.to_json() for j in jobs]}


@app.task(name="utxoflow.prune.chunk")
def prune_chunk(key_hex: str, run: str, height: int, stable_at: int | None) -> dict[str, Any]:
    """Delete chunks of a run's posting until none is left (a late helper finds none)."""
    return {"chunks": services().pruner.help(key_hex, run, height, stable_at)}
