"""A worker's metrics endpoint: the sum of its processes' metrics (prometheus-client's
multiprocess mode).

A Celery worker is a main process and its pool's children (prefork): each child counts in its
own memory unless multiprocess mode is on, and that mode is chosen when prometheus_client is
first imported. So `utxo worker` with a metrics port (UTXO_METRICS_PORT / --metrics-port) makes
a fresh directory and sets PROMETHEUS_MULTIPROC_DIR before anything imports it (`prepare`: this
module imports prometheus_client only inside its functions, for that reason); the main process
serves the sum over every process of the directory (`serve`), and a child that ends marks itself
dead (its live gauges go; its counters stay, as counters must). Under
`celery -A workers.runtime.app worker` the operator sets PROMETHEUS_MULTIPROC_DIR to an empty directory,
as prometheus-client's documentation says.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

log = logging.getLogger("utxoflow.metrics")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_owned_dir: str | None = None


def prepare(port: int) -> None:
    """Before prometheus_client is imported by anything else of a worker that serves metrics on
    `port`: a directory of its own for multiprocess mode, removed at exit. A directory the
    operator set is used as it is (its old files are theirs to clear)."""
    global _owned_dir
    if not port or os.environ.get(MULTIPROC_ENV):
        return
    _owned_dir = tempfile.mkdtemp(prefix="utxoflow-metrics-")
    os.environ[MULTIPROC_ENV] = _owned_dir


def cleanup() -> None:
    if _owned_dir is not None:
        shutil.rmtree(_owned_dir, ignore_errors=True)


def serve(port: int, address: str = "0.0.0.0") -> Any:
    """Serve /metrics on `port` from this (the worker's main) process: the sum over every
    process of the multiprocess directory. None, with a warning, when the mode is off (the
    children's counts would not be seen)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client import multiprocess as mp

    directory = os.environ.get(MULTIPROC_ENV)
    if not directory or not os.path.isdir(directory):
        log.warning("UTXO_METRICS_PORT=%d needs %s set to an empty directory before the worker "
                    "starts (`utxo worker` does it): no metrics served", port, MULTIPROC_ENV)
        return None
    registry = CollectorRegistry()
    mp.MultiProcessCollector(registry)
    server, _thread = start_http_server(port, addr=address, registry=registry)
    log.info("metrics on http://%s:%d/metrics", address, port)
    return server


def process_ended(pid: int) -> None:
    """A pool child ends: its live gauges leave the sum (prometheus-client multiprocess mode)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess as mp

        mp.mark_process_dead(pid)
