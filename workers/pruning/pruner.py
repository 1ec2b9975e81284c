"""The pruner's job manager (Teranode's pruner service on Celery; docs/architecture.md, "Pruning"): requests,
the one run at a time, and the loop that takes jobs until the slot is empty. A run's phases are
`workers.pruning.prunerun`'s; the slot, lock and history live in the state store (`stores.state.prunejobs`).

Invariants:
- Every block that reaches the best chain, set-mined done (its batch committed), requests a run
  at its height: the pruner never runs ahead of mining. Requests go to the one-job slot
  (latest height wins); a request sends a run task only when no live runner holds the lock —
  a live runner takes the slot's job itself when it finishes (`drive` takes jobs until the slot
  is empty), so catch-up neither queues runs nor loses the last request.
- A runner renews its job's lease while it works (between chunks) and stops when the renewal
  fails (its job was failed by a taker: lapsed or timed out) or its job passes the job timeout:
  two runners never delete at once for long, and even then each record goes in a unit of its
  own that re-checks it under lock.
- A run task redelivered after its worker died finds the dead job (its holder a dead process,
  or its lease lapsed), fails it and runs its height again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from stores.blob.protocol import BlobStore
from stores.lease import holder_id
from stores.state import StateStore
from stores.state.prunejobs import CANCELLED, COMPLETED, FAILED, PruneJob, Requested
from stores.utxo import UtxoStore
from workers.ops import metrics
from workers.pruning.prunerun import LeaseLost, PrunerConfig, PruneRun, Skip, work_chunks

log = logging.getLogger("utxoflow.pruner")

RUN_TASK = "utxoflow.prune.run"


class Pruner:
    def __init__(
        self,
        utxo: UtxoStore,
        state: StateStore,
        blobs: BlobStore,
        config: PrunerConfig,
        *,
        send: Callable[[str, list[Any]], None] | None = None,
        start_known: Callable[[], bool] = lambda: True,
        shared: bool = False,
    ) -> None:
        self.utxo = utxo
        self.state = state
        self.blobs = blobs
        self.config = config
        self.send = send
        self.start_known = start_known
        # chunks go to other workers as tasks where the store takes concurrent writers
        self.shared = shared and send is not None and config.chunk_group_limit > 1
        self._last_request = -1

    # -- requests ---------------------------------------------------------------------------------
    def block_applied(self, height: int) -> None:
        """The sequencer's hook: a block (the last of a batch) is on the best chain, mined."""
        if not self.config.auto or height <= self._last_request:
            return
        self._last_request = height
        try:
            self.request(height)
        except Exception as e:  # the block is applied: the next one asks again; pruning can wait
            log.warning("could not request a prune run at height %d: %s", height, e)

    def request(self, height: int) -> Requested:
        """Put `height` in the slot (latest wins) and start a runner if none is live."""
        r = self.state.prune_request(height, self.config.job_timeout)
        if r.start and self.send is not None:
            try:
                self.send(RUN_TASK, [])
            except Exception as e:  # the job waits in the slot: the next request sends again
                log.warning("could not send a prune run task (job %d waits): %s", r.job.id, e)
        return r

    # -- running ----------------------------------------------------------------------------------
    def drive(self) -> list[PruneJob]:
        """Take and run jobs until the slot is empty or another runner holds the lock; the jobs
        this call ran, as they ended."""
        holder = holder_id()
        ran: list[PruneJob] = []
        while True:
            job = self.state.prune_take(holder, self.config.lease_s, self.config.job_timeout)
            if job is None:
                return ran
            ran.append(self.run(job, holder))

    def run(self, job: PruneJob, holder: str) -> PruneJob:
        """One job, start to end; the job as it ended."""
        run = PruneRun(self, job, holder)
        status, error = COMPLETED, None
        try:
            run.execute()
        except Skip as e:
            status, error = CANCELLED, f"skipped: {e}"
            log.info("prune job %d (height %d) skipped: %s", job.id, job.height, e)
        except LeaseLost as e:
            log.warning("prune job %d (height %d) stopped: %s", job.id, job.height, e)
            return self.state.prune_job(job.id) or job
        except Exception as e:
            status, error = FAILED, f"{type(e).__name__}: {e}"
            log.exception("prune job %d (height %d) failed", job.id, job.height)
        run.figures["seconds"] = round(time.monotonic() - run.t0, 3)
        if not self.state.prune_finish(job.id, holder, status, run.figures, error):
            log.warning("prune job %d ended after another worker had failed it", job.id)
        else:
            log.info("prune job %d (height %d) %s: %s", job.id, job.height, status, run.figures,
                     extra={"height": job.height, "phase": "prune", "job": job.id, "status": status,
                            "duration_s": run.figures["seconds"]})
            metrics.prune_run(status, run.figures)
        return self.state.prune_job(job.id) or job

    def help(self, key_hex: str, run: str, height: int, stable_at: int | None) -> int:
        """A chunk task's work: delete chunks of a run's posting until none is left."""
        return work_chunks(self, bytes.fromhex(key_hex), run, height, stable_at, holder_id())
