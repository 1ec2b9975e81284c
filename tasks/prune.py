"""Pruner tasks (queue `prune`): a run of the job manager, and the helpers that delete chunks of a
run where the store takes concurrent writers (workers/pruner.py, workers/prunerun.py)."""

from __future__ import annotations

import logging
from typing import Any

from stores.errors import StorageError
from workers.app import app
from workers.services import services

log = logging.getLogger("utxoflow.tasks")


@app.task(name="utxoflow.prune.run")
def prune_run() -> dict[str, Any]:
    """Take and run pruning jobs until the slot is empty (or another worker holds the lock).
    Safe at any time, on any number of workers at once; redelivered after its worker died, it
    fails the dead job and runs its height again."""
    try:
        jobs = services().pruner.drive()
    except StorageError as e:  # a store is down: the job waits in the slot for the next request
        log.warning("the prune run is skipped: %s", e)
        return {"skipped": str(e)}
    return {"jobs": [j.to_json() for j in jobs]}


@app.task(name="utxoflow.prune.chunk")
def prune_chunk(key_hex: str, run: str, height: int, stable_at: int | None) -> dict[str, Any]:
    """Delete chunks of a run's posting until none is left (a late helper finds none)."""
    return {"chunks": services().pruner.help(key_hex, run, height, stable_at)}
