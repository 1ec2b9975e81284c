"""Block tasks (queue `blocks`): a block's bytes are in the blob store; the message names it."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from chain import hex_to_hash
from stores.errors import StorageError
from workers.app import app
from workers.blockindex import BlockMissing
from workers.sequencer import ChainBusy, Unfinished
from workers.services import services

log = logging.getLogger("utxoflow.tasks")
MISSING_RETRIES = 3  # a block whose bytes are nowhere is reported after this many tries


@app.task(name="utxoflow.block.arrived", bind=True, max_retries=None)
def block_arrived(self: Task, block_hash: str, ident: str) -> dict[str, Any]:
    """Index the block and apply the best chain. Idempotent: a redelivered message finds the
    block known and the chain applied. While another worker holds the chain, try again soon:
    that worker may have finished its pass before this block was indexed."""
    svc = services()
    seq = svc.sequencer
    h = hex_to_hash(block_hash)
    try:
        entry = seq.accept(seq.load(h))
        if entry is None:  # another worker is indexing: soon again
            raise self.retry(countdown=0.2)
        seq.advance(budget_s=svc.settings.block_task_budget)
    except ChainBusy as e:  # another worker applies the chain; it may have missed this block
        raise self.retry(countdown=0.2) from e
    except Unfinished as e:  # the budget ran out: the message goes back, any worker goes on
        log.info("block %s: the task's budget ran out, it hands the rest of the chain on", block_hash)
        raise self.retry(countdown=0) from e
    except BlockMissing as e:
        if e.block_hash != h:  # another block of the chain: the chain waits for its bytes
            log.error("block %s: %s (will retry)", block_hash, e)
            raise self.retry(countdown=min(2 ** min(self.request.retries, 4), 10)) from e
        if self.request.retries < MISSING_RETRIES:  # maybe not written yet (a blob replica)
            raise self.retry(countdown=0.5 * (self.request.retries + 1)) from e
        log.error("block %s given up: %s", block_hash, e)
        svc.registry.done(ident)
        return {"hash": block_hash, "status": "missing", "reason": str(e)}
    except StorageError as e:  # a store is down: the block waits, it is not lost
        log.warning("block %s: %s (will retry)", block_hash, e)
        raise self.retry(countdown=min(2 ** min(self.request.retries, 4), 10)) from e
    svc.registry.done(ident)
    now = svc.state.get_block(entry.hash)
    return (now or entry).to_json()
