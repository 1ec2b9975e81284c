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
from stores.state import PendingEntry, StateStore
from workers.broker.runs import BrokerUnreachable
from workers.runtime.ingest import TASKS, TX_BATCH, publish_known, publish_txs
from workers.runtime.services import Services

log = logging.getLogger("utxoflow.requeue")
BATCH = 500  # entries claimed per round: one write transaction each, however many are due

Publish = Callable[[str, str, str], None]  # (task, its argument, the message id)
PublishTxs = Callable[[list[str], list[str]], None]  # (txids, their message ids): one batch message


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
    state: StateStore, broker_run: str | None, after_s: float, publish: Publish, batch: int = BATCH,
    publish_txs: PublishTxs | None = None, tx_batch: int = TX_BATCH,
) -> RequeueReport:
    """Claim every due entry, a batch at a time, and send its message again: each block's alone,
    and, with `publish_txs`, consecutive transactions together, `tx_batch` to a message (a burst
    lost with the broker goes back at the speed it came). A send that fails ends the scan: its
    entries and the rest of the claimed batch are unclaimed (reported as failed)."""
    lost = stale = failed = messages = 0
    cursor = 0
    while True:
        # on in registration order: an entry claimed by this scan is not taken twice, even with
        # an `after_s` so short that it is due again before the scan ends
        claimed = state.claim_pending(broker_run, after_s, batch, after=cursor)
        i = 0
        while i < len(claimed):
            group = _group(claimed, i, tx_batch if publish_txs is not None else 1)
            try:
                if publish_txs is not None and group[0].kind == "tx":
                    publish_txs([e.key for e in group], [e.ident for e in group])
                else:
                    publish(TASKS[group[0].kind], group[0].key, group[0].ident)
            except Exception as err:  # the broker went away again: the next scan goes on
                failed = len(claimed) - i
                state.unclaim_pending([c.ident for c in claimed[i:]])
                log.warning("re-sending stopped after %d: %s; %d left for the next scan",
                            lost + stale, err, failed)
                break
            i += len(group)
            messages += 1
            cursor = group[-1].seq
            was_lost = sum(broker_run is not None and e.broker_run != broker_run for e in group)
            lost, stale = lost + was_lost, stale + len(group) - was_lost
        if failed or len(claimed) < batch:
            break
    report = RequeueReport(broker_run, lost, stale, failed)
    if report.resent:
        log.warning("re-sent %d pending id(s) in %d message(s): %d lost with an earlier broker run, %d "
                    "pending longer than %.0f s", report.resent, messages, lost, stale, after_s)
    return report


def _group(claimed: list[PendingEntry], i: int, most: int) -> list[PendingEntry]:
    """The entries sent in one message from `claimed[i]` on: a block alone; consecutive
    transactions, `most` at the most."""
    if claimed[i].kind != "tx":
        return [claimed[i]]
    j = i + 1
    while j < len(claimed) and j - i < most and claimed[j].kind == "tx":
        j += 1
    return claimed[i:j]


def scan(svc: Services) -> dict[str, Any]:
    """One scan with a process's services (what the task runs): the report, or why it was
    skipped (the broker or the state store did not answer; the next scan tries again)."""
    try:
        run = svc.registry.broker.current(fresh=True) if svc.registry.broker else None
        send = partial(publish_known, svc.state)
        return requeue(svc.state, run, svc.settings.requeue_after, send, publish_txs=publish_txs).to_json()
    except (BrokerUnreachable, StorageError) as e:
        log.warning("re-sending scan skipped: %s", e)
        return {"skipped": str(e)}
