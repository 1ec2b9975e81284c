"""Block tasks (queue `blocks`): a block's bytes are in the blob store; the message names it.

A block task never polls: it indexes its block (unless `utxo enqueue` did), then applies the
best chain if nobody else is applying it; if somebody is, it acknowledges and leaves its block
to that worker, which looks at the chain again after letting go (workers/chainstate/sequencer.py). Its
message id stays pending until the holder has applied (or refused) the block
(workers/runtime/registry.py), so `utxo wait` still means "applied", and the requeue scan sends the
message again should the holder die. A task whose own block ends refused ends as Refused
(shown failed in Flower, with the reason)."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from chain import hex_to_hash
from stores.errors import StorageError
from stores.state import BlockStatus
from workers.chainstate.blockindex import BlockMissing, CorruptBlock, corrupt
from workers.chainstate.chainlease import ChainBusy, Unfinished
from workers.runtime.app import app
from workers.runtime.outcome import Refused
from workers.runtime.services import Services, services

log = logging.getLogger("utxoflow.tasks")
MISSING_RETRIES = 3  # a block whose bytes are nowhere is reported after this many tries
# a block settled this way needs its body no more (the pruner removes bodies below the retention)
SETTLED = (BlockStatus.APPLIED, BlockStatus.SIDE, BlockStatus.INVALID)


def _prepare_ahead(svc: Services) -> None:
    """Meanwhile, prepare the blocks the holder applies next (`workers.chainstate.prepare`). Only a saving
    for the holder: a failure here is logged and never fails the block's task."""
    try:
        made = svc.sequencer.prepare_ahead(budget_s=svc.settings.block_task_budget)
    except StorageError as e:
        log.warning("preparing blocks ahead of the chain stopped: %s", e)
    except Exception:  # a bug in an optimisation must not hold up the chain
        log.exception("preparing blocks ahead of the chain failed")
    else:
        if made:
            log.debug("prepared %d blocks ahead of the chain", made)


@app.task(name="utxoflow.block.arrived", bind=True, max_retries=None, throws=(Refused,))
def block_arrived(self: Task, block_hash: str, ident: str) -> dict[str, Any]:
    """Index the block and apply the best chain (see above). Idempotent: a redelivered
    message finds the block known and the chain applied."""
    h = hex_to_hash(block_hash)
    try:
        svc = services()  # (first call in a process: opens the stores, which may fail)
        seq = svc.sequencer
        entry = seq.state.get_block(h)  # indexed by `utxo enqueue` already: not parsed here
        if entry is None or corrupt(entry):
            entry = seq.accept(seq.load(h))  # (waits for the index lease: parsed once)
        elif entry.status is not BlockStatus.ORPHAN:
            seq.index.heal(entry)  # (orphans a worker that died while indexing it left below it)
        if entry is None:  # another worker has been indexing for long: later
            raise self.retry(countdown=1.0)
        seq.advance(budget_s=svc.settings.block_task_budget)
    except ChainBusy:  # the holder applies it: it looks at the chain again before it lets go
        log.debug("block %s indexed; the chain's holder applies it", block_hash)
        assert entry is not None
        if entry.status is BlockStatus.INVALID:  # refused as it was indexed: nothing to apply
            raise Refused(f"block {block_hash} refused: {entry.reason}") from None
        _prepare_ahead(svc)
        return entry.to_json()
    except Unfinished as e:  # the budget ran out: the message goes back, any worker goes on
        log.info("block %s: the task's budget ran out, it hands the rest of the chain on", block_hash)
        raise self.retry(countdown=0) from e
    except BlockMissing as e:
        if e.block_hash != h:  # another block of the chain: the chain waits for its bytes
            log.error("block %s: %s (will retry)", block_hash, e)
            raise self.retry(countdown=min(2 ** min(self.request.retries, 4), 10)) from e
        try:
            known = svc.state.get_block(h)
        except StorageError:  # the state store is down: try again later
            raise self.retry(countdown=min(2 ** min(self.request.retries, 4), 10)) from e
        if known is not None and known.status in SETTLED:  # its body was pruned: nothing to do
            svc.registry.done(ident)
            return known.to_json()
        if self.request.retries < MISSING_RETRIES:  # maybe not written yet (a blob replica)
            raise self.retry(countdown=0.5 * (self.request.retries + 1)) from e
        log.error("block %s given up: %s", block_hash, e)
        svc.registry.done(ident)
        return {"hash": block_hash, "status": "missing", "reason": str(e)}
    except CorruptBlock as e:  # its stored bytes are bad: the same ones at every try
        if e.block_hash != h:  # another block's, on the way (a reorg's): the chain waits for it
            log.error("block %s: %s (will retry)", block_hash, e)
            raise self.retry(countdown=10) from e
        log.error("block %s given up: %s", block_hash, e)
        svc.registry.done(ident, refused=(str(e), None))
        raise Refused(f"block {block_hash} refused: {e}") from None
    except StorageError as e:  # a store is down: the block waits, it is not lost
        log.warning("block %s: %s (will retry)", block_hash, e)
        raise self.retry(countdown=min(2 ** min(self.request.retries, 4), 10)) from e
    svc.registry.done(ident)
    svc.registry.done_blocks(seq.take_settled())  # those left to this worker among them
    now = svc.state.get_block(entry.hash) or entry
    if now.status is BlockStatus.INVALID:
        raise Refused(f"block {block_hash} refused: {now.reason}")
    return now.to_json()
