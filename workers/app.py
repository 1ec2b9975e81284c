"""The Celery app (`celery -A workers.app worker` works, as does `utxo worker`)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from workers import kombu_fix

kombu_fix.apply()  # a worker must outlive a restart of Redis (see the module)
app = Celery(
    "utxoflow", include=["tasks.blocks", "tasks.chunks", "tasks.prune", "tasks.recovery", "tasks.txs"]
)
app.config_from_object("celeryconfig")
log = logging.getLogger("utxoflow.app")


@worker_ready.connect
def resume_the_chain(**_: Any) -> None:
    """A worker starting finds the chain not at rest (a block half applied, or the best chain
    ahead of the tip: its worker died with the message, which Redis gives back only after the
    visibility timeout): it sends one block message to take it up. The task is idempotent."""
    from stores.state import open_state_store
    from workers.sequencer import APPLYING
    from workers.settings import load_settings

    try:
        state = open_state_store(load_settings().state_url, create=False)
    except Exception:
        return
    try:
        best, tip = state.best_candidate(), state.tip()
        if best is None or (state.get_meta(APPLYING) is None and tip is not None and tip.hash == best.hash):
            return
        h = best.hash[::-1].hex()
        log.warning("the chain is not at rest (tip %s, best %s): resuming it",
                    tip and tip.height, best.height)
        app.send_task("utxoflow.block.arrived", args=[h, f"resume:{uuid.uuid4().hex[:12]}"])
    finally:
        state.close()


@worker_ready.connect
def requeue_lost_messages(sender: Any = None, **_: Any) -> None:
    """A worker starting sends one re-sending scan (workers/requeue.py): messages pending from
    before a broker restart, or from a worker that died holding them, are sent again now. Then
    it sends one every UTXO_REQUEUE_INTERVAL seconds from a thread of its main process, as
    `utxo beat` does, so that no beat is needed: a broker that lost its queues while the
    workers ran is noticed within an interval. Any worker may take a scan; scans at once are
    safe (each due message is claimed by one), and one not taken within an interval expires.
    Only a worker of the `recovery` queue sends the periodic ones: Redis drops an expired
    message only when a worker takes it, so scans sent where none is taken would pile up."""
    from workers.settings import load_settings

    interval = load_settings().requeue_interval
    _send_scan(interval)
    consumer = getattr(sender, "task_consumer", None)
    queues = {q.name for q in getattr(consumer, "queues", None) or ()}
    if not queues or "recovery" in queues:
        threading.Thread(target=_scan_every, args=(interval,), name="utxoflow-requeue", daemon=True).start()


def _send_scan(expires: float) -> None:
    try:
        app.send_task("utxoflow.recovery.requeue", expires=expires)
    except Exception as e:  # the worker runs on: the next interval tries again
        log.warning("could not send the re-sending scan: %s", e)


def _scan_every(interval: float) -> None:
    while True:
        time.sleep(interval)
        _send_scan(interval)
