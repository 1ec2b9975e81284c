"""Recovery tasks (queue `recovery`): entries the recovery manager claimed, handled; and the
re-sending scan of messages the broker lost (which `utxo beat` may still send)."""

from __future__ import annotations

import logging
from typing import Any

from stores.errors import StorageError
from workers.recovery.handlers import release_all
from workers.recovery.requeue import scan
from workers.runtime.app import app
from workers.runtime.services import services

log = logging.getLogger("utxoflow.tasks")


@app.task(name="utxoflow.recovery.handle")
def handle(idents: list[str], holder: str) -> dict[str, Any]:
    """Handle the entries a manager claimed under `holder` and release each with its outcome
    (workers/recovery/handlers.py). Entries no longer held under that name (the lease ran out
    and another claim took them, or they ended) are left alone. A store that cannot be reached
    leaves the claims to lapse: they are claimed again after the lease."""
    try:
        svc = services()
        entries = [e for i in idents if (e := svc.state.recovery_entry(i)) is not None and e.holder == holder]
        done = release_all(svc, entries)
    except StorageError as e:
        log.warning("recovery of %d entries skipped: %s", len(idents), e)
        return {"skipped": str(e)}
    for d in done:
        if d["status"] != "pending" or d["outcome"].startswith("failed"):
            log.info("recovery: %s → %s (%s)", d["ident"], d["status"], d["outcome"])
    return {"handled": len(done), "stale": len(idents) - len(entries)}


@app.task(name="utxoflow.recovery.requeue")
def requeue() -> dict[str, Any]:
    """One scan of the pending messages (workers/recovery/requeue.py). Safe at any time, on any number of
    workers at once: each due message is claimed, and so re-sent, by one scan only. A store that
    cannot be reached skips this scan (the next one, a beat interval later, tries again)."""
    try:
        return scan(services())
    except StorageError as e:
        log.warning("the requeue scan is skipped: %s", e)
        return {"skipped": str(e)}
