"""The Celery app (`celery -A workers.app worker` works, as does `utxo worker`: `workers/app.py`):
its configuration, kombu's fix, and JSON logs. What a worker does at its signals is `workers.hooks`."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from workers.broker import kombu_fix

HOME = Path(__file__).resolve().parents[2]  # where utxoflow's top-level modules are


def own(name: str) -> ModuleType:
    """utxoflow's top-level module `name` (`celeryconfig`, `tasks`: names other projects use
    too). ValueError, naming both, when another module of that name comes first on sys.path:
    a `celeryconfig.py` in the directory a worker starts in (which Celery puts first) would
    configure it silently, and another `tasks` would leave it without its tasks."""
    mod = importlib.import_module(name)
    where = Path(mod.__file__ or name).resolve()
    if HOME not in where.parents:
        raise ValueError(f"the module {name!r} Python finds first is {where}, not utxoflow's (in {HOME}): "
                         "start from another directory, or rename that module")
    return mod


kombu_fix.apply()  # a worker must outlive a restart of Redis (see the module)
own("tasks")
# (workers.hooks: what a worker does at its signals; imported by the worker as it starts, before
# any signal, and by no other process)
app = Celery(
    "utxoflow",
    include=["tasks.blocks", "tasks.chunks", "tasks.prune", "tasks.recovery", "tasks.txs", "workers.hooks"],
)
app.config_from_object(own("celeryconfig"))


@after_setup_logger.connect
@after_setup_task_logger.connect
def json_logs(logger: Any = None, **_: Any) -> None:
    from workers.settings import load_settings

    if logger is not None and load_settings().log_json:
        from workers.ops.logs import use_json

        use_json(logger)
