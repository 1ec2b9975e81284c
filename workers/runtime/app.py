"""The Celery app (`celery -A workers.app worker` works, as does `utxo worker`: `workers/app.py`):
its configuration, kombu's fix, and JSON logs. What a worker does at its signals is `workers.hooks`."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from workers.broker import kombu_fix

kombu_fix.apply()  # a worker must outlive a restart of Redis (see the module)
# (workers.hooks: what a worker does at its signals; imported by the worker as it starts, before
# any signal, and by no other process)
app = Celery(
    "utxoflow",
    include=["tasks.blocks", "tasks.chunks", "tasks.prune", "tasks.recovery", "tasks.txs", "workers.hooks"],
)
app.config_from_object("celeryconfig")


@after_setup_logger.connect
@after_setup_task_logger.connect
def json_logs(logger: Any = None, **_: Any) -> None:
    from workers.settings import load_settings

    if logger is not None and load_settings().log_json:
        from workers.ops.logs import use_json

        use_json(logger)
