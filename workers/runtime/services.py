"""The stores and coordinators one process uses, opened once from the settings (lazily, so a
forked worker child opens its own connections) and closed when the process ends."""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any

from stores.blob import BlobStore, open_blob_store
from stores.blob.observed import on_error as on_blob_error
from stores.state import StateStore, open_state_store
from stores.utxo import UtxoStore, open_utxo_store
from stores.utxo.gcpause import tune_for_blocks
from workers.broker.runs import BrokerRun
from workers.chainstate.fanout import TaskFanout
from workers.chainstate.sequencer import Sequencer
from workers.ops.metrics import count_blob_error
from workers.pruning.pruner import Pruner, PrunerConfig
from workers.runtime.registry import Registry
from workers.settings import Settings, load_settings


@dataclass
class Services:
    settings: Settings
    utxo: UtxoStore
    state: StateStore
    blobs: BlobStore
    sequencer: Sequencer
    registry: Registry
    pruner: Pruner

    def close(self) -> None:
        for s in (self.utxo, self.state, self.blobs):
            try:
                s.close()
            except Exception:
                pass


def _send(task: str, args: list[Any]) -> None:
    from workers.runtime.app import app  # here: the app imports the tasks, which import this module

    app.send_task(task, args=args)


_lock = threading.Lock()
_services: Services | None = None
# A phase is shared with helpers only from this many units on (UTXO_BLOCK_CHUNK_TXS each):
# `python -m bench.pipeline --backend postgresql`, 2 workers on 2 cores, measured sharing a
# 2,000-tx block's 2 units at 10.3-12.3k tx/s against 14.6k run by the coordinator alone, and
# an 8,000-tx block's 8 units at 13.6k against 13.4k: below 4 the messages cost more than the
# second worker brings.
SHARE_FROM_UNITS = 4


def services(**overrides: Any) -> Services:
    global _services
    with _lock:
        if _services is None:
            tune_for_blocks()  # a worker process: blocks, and transactions by the thousand
            on_blob_error(count_blob_error)  # (before any blob store of this process is opened)
            s = load_settings(**overrides)
            utxo = open_utxo_store(s.store_url, **s.store_options())
            state = open_state_store(s.state_url)
            blobs = open_blob_store(s.blob_url)
            fanout = TaskFanout(state, _send, max_helpers=s.chunk_helpers(), share_from=SHARE_FROM_UNITS)
            seq = Sequencer(utxo, state, blobs, allow_missing_inputs=s.allow_missing_inputs,
                            chunk_txs=s.block_chunk_txs, fanout=fanout)
            registry = Registry(state, BrokerRun(s.broker_url))
            # prune chunks go to other workers only where the store takes concurrent writers
            shared = utxo.concurrent_writers and s.chunk_helpers() > 0
            pruner = Pruner(utxo, state, blobs, PrunerConfig.from_settings(s), send=_send,
                            start_known=seq.index.start_known, shared=shared)
            seq.on_applied = pruner.block_applied
            _services = Services(s, utxo, state, blobs, seq, registry, pruner)
            atexit.register(_services.close)
        return _services

