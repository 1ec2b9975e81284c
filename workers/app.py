"""The Celery app (`celery -A workers.app worker` works, as does `utxo worker`)."""

from __future__ import annotations

from celery import Celery

app = Celery("utxoflow", include=["tasks.blocks", "tasks.txs"])
app.config_from_object("celeryconfig")
