"""Recovery tasks (queue `recovery`): sending again the messages the broker lost."""

from __future__ import annotations

import logging
from typing import Any

from stores.errors import StorageError
from workers.app import app
from workers.requeue import scan
from workers.services import services

log = logging.getLogger("utxoflow.tasks")


@app.task(name="utxoflow.recovery.requeue")
def requeue() -> dict[str, Any]:
    """One scan of the pending messages (workers/requeue.py). Safe at any time, on any number of
    workers at once: each due message is claimed, and so re-sent, by one scan only. A store that
    cannot be reached skips this scan (the next one, a beat interval later, tries again)."""
    try:
        return scan(services())
    except StorageError as e:
        log.warning("the requeue scan is skipped: %s", e)
        return {"skipped": str(e)}
