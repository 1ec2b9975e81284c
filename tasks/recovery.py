"""Recovery tasks (queue `recovery`): sending again the messages the broker lost."""

from __future__ import annotations

from typing import Any

from workers.app import app
from workers.requeue import scan
from workers.services import services


@app.task(name="utxoflow.recovery.requeue")
def requeue() -> dict[str, Any]:
    """One scan of the pending messages (workers/requeue.py). Safe at any time, on any number of
    workers at once: each due message is claimed, and so re-sent, by one scan only."""
    return scan(services())
