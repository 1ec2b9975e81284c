"""Sending again the messages a broker lost: one scan of the registry of pending messages
(workers/runtime/registry.py), run by the `utxoflow.recovery.requeue` task, which every worker sends
when it starts and then every UTXO_REQUEUE_INTERVAL seconds (`workers/runtime/app.py`), as `utxo beat`
does.

A pending entry is due when its message was sent under another broker run than the current one
(the broker restarted and, keeping nothing on disk, lost it: certainly gone) or more than
UTXO_REQUEUE_AFTER seconds ago (a worker died holding it, which Redis hands back only after its
visibility timeout, an hour; or it is merely slow — re-sent anyway, once per that period).

Invariants:
- An entry is re-sent only by the scan that claimed it (stores/state/pending.py), and a claim
  marks it sent now under the current run: two scans at once (workers starting, beat) never
  both send it, and none sends it again before it is due again — no flood of copies.
- A claimed entry whose send fails is unclaimed, so the next scan takes it at once.
- Re-sending is safe whatever became of the first message: every task is idempotent, and the
  entry is removed only by a task that finished its work for good (the registry's invariant).
- Nothing is claimed while the broker cannot say which run it is: it could not take the
  messages anyway, and a claim would only postpone them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from stores.errors import StorageError
from stores.state import StateStore
from workers.broker.runs import BrokerUnreachable
from workers.runtime.ingest import TASKS, publish_known
from workers.runtime.services import Services

log = logging.getLogger("utxoflow.requeue")
BATCH = 500  # entries claimed per round: one write transaction each, however many are due

Publish = Callable[[str, str, str], None]  # (task, its argument, the message id)


@dataclass(frozen=True, slots=True)
class RequeueReport:
    broker_run: str | None  # the run the messages were re-sent under (None: a broker without runs)
    lost: int  # re-sent: they were sent under another broker run
    stale: int  # re-sent: sent too long ago under this run
    failed: int  # claimed but not sent (the broker failed meanwhile): unclaimed for the next scan

    @property
    def resent(self) -> int:
        return self.lost + self.stale

    def to_json(self) -> dict[str, Any]:
        return {"broker_run": self.broker_run, "resent": self.resent, "lost": self.lost,
                "stale": self.stale, "failed": self.failed}


def requeue(
    state: StateStore, broker_run: str | None, after_s: float, publish: Publish, batch: int = BATCH
) -> RequeueReport:
    """Claim every due entry, a batch at a time, and send its message again. A send that fails
    ends the scan: that entry and the rest of its batch are unclaimed (reported as failed)."""
    lost = stale = failed = 0
    cursor = 0
    while True:
        # on in registration order: an entry claimed by this scan is not taken twice, even with
        # an `after_s` so short that it is due again before the scan ends
        claimed = state.claim_pending(broker_run, after_s, batch, after=cursor)
        for i, e in enumerate(claimed):
            try:
                publish(TASKS[e.kind], e.key, e.ident)
            except Exception as err:  # the broker went away again: the next scan goes on
                failed = len(claimed) - i
                state.unclaim_pending([c.ident for c in claimed[i:]])
                log.warning("re-sending stopped after %d: %s; %d left for the next scan",
                            lost + stale, err, failed)
                break
            cursor = e.seq
            if broker_run is not None and e.broker_run != broker_run:
                lost += 1
            else:
                stale += 1
        if failed or len(claimed) < batch:
            break
    report = RequeueReport(broker_run, lost, stale, failed)
    if report.resent:
        log.warning("re-sent %d message(s): %d lost with an earlier broker run, %d pending longer than "
                    "%.0f s", report.resent, lost, stale, after_s)
    return report


def scan(svc: Services) -> dict[str, Any]:
    """One scan with a process's services (what the task runs): the report, or why it was
    skipped (the broker or the state store did not answer; the next scan tries again)."""
    try:
        run = svc.registry.broker.current(fresh=True) if svc.registry.broker else None
        send = partial(publish_known, svc.state)
        return requeue(svc.state, run, svc.settings.requeue_after, send).to_json()
    except (BrokerUnreachable, StorageError) as e:
        log.warning("re-sending scan skipped: %s", e)
        return {"skipped": str(e)}
