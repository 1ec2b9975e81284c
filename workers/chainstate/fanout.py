"""Running a block phase's units: in this process, or shared with other workers as tasks.

The block's coordinator (the worker holding the chain lease) posts a phase's units on the
state store's chunk board, sends helper tasks (`utxoflow.chunk.<phase>`, queue `txs`), and
then works on the units itself; helpers claim units from the same board until none is left.
The coordinator returns once every unit is done (or cancelled after a refusal).

Invariants:
- The coordinator never waits on a unit nobody can run: it claims units itself, so a block
  completes with no helper at all (one worker, or helper messages lost with a Redis restart),
  and it takes over units whose holder lapsed or is a dead process of this host.
- A unit's work is idempotent (create: TxExists is fine; spend: the same spender again is
  fine; set mined twice is a no-op), so a unit run twice — a holder that lapsed but lived on —
  changes nothing. A refusal cancels the unclaimed units, and the coordinator takes the block
  back only after every held unit has settled.
- Helpers act only on a posting that still exists (its run id): a late helper does nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from chain import Block
from stores.errors import StorageError
from stores.lease import holder_gone, holder_id
from stores.state import StateStore
from stores.state.chunks import CANCELLED, DONE, HELD

log = logging.getLogger("utxoflow.fanout")
Result = dict[str, Any]


class UnitRunner(Protocol):
    """What a fanout needs of the applier whose units it runs (`blockapply.BlockApplier`)."""

    @property
    def heartbeat(self) -> Callable[[], None]:  # renews the chain lease while units run
        ...

    def execute(self, block: Block, phase: str, ctx: dict[str, int], spec: dict[str, Any]) -> Result: ...


class Fanout(Protocol):
    local: bool  # every unit runs in this process (no other worker writes for the block)

    def run(self, applier: UnitRunner, block: Block, phase: str, ctx: dict[str, int],
            specs: list[dict[str, Any]]) -> list[Result]:
        """Every unit's result, in unit order (a refused unit's result has `refused`)."""


class LocalFanout:
    """Every unit in this process, in order, stopping at the first refusal."""

    local = True

    def run(self, applier: UnitRunner, block: Block, phase: str, ctx: dict[str, int],
            specs: list[dict[str, Any]]) -> list[Result]:
        out = []
        for spec in specs:
            applier.heartbeat()
            r = applier.execute(block, phase, ctx, spec)
            out.append(r)
            if "refused" in r:
                break
        return out


def work_units(state: StateStore, applier: UnitRunner, block_hash: bytes, get_block: Callable[[], Block],
               phase: str, run: str, ctx: dict[str, int], holder: str, ttl_s: float,
               take_over: str | None = None, beat: Callable[[], None] | None = None) -> int:
    """Claim and run units of a posting until none is left to claim; how many this ran. A unit
    that fails on the stores records the error as its result (the coordinator reports it). The
    block is fetched only once there is a unit to run."""
    ran = 0
    while True:
        if beat is not None:
            beat()
        unit = state.claim_unit(block_hash, phase, run, holder, ttl_s, take_over)
        if unit is None:
            return ran
        take_over = None
        try:
            block = get_block()
        except StorageError as e:  # not this worker's to judge: give the unit back, stop helping
            log.warning("%s unit %d of block %s given back: %s", phase, unit.idx, block_hash[::-1].hex(), e)
            state.finish_unit(block_hash, phase, run, unit.idx, holder, None)
            return ran
        try:
            result = applier.execute(block, phase, ctx, unit.spec)
        except StorageError as e:
            result = {"error": str(e)}
        except Exception as e:  # a bug: report it through the coordinator, do not lose the unit
            log.exception("%s unit %d of block %s failed", phase, unit.idx, block_hash[::-1].hex())
            result = {"error": f"{type(e).__name__}: {e}"}
        ran += 1
        if not state.finish_unit(block_hash, phase, run, unit.idx, holder, result):
            log.warning("%s unit %d of block %s: the claim lapsed before it finished (harmless: "
                        "units are idempotent)", phase, unit.idx, block_hash[::-1].hex())
        if "refused" in result:
            state.cancel_units(block_hash, phase, run)


class TaskFanout:
    """Units shared with other workers through the chunk board and helper tasks."""

    def __init__(self, state: StateStore, send: Callable[[str, list[Any]], None], *,
                 ttl_s: float = 120.0, max_helpers: int = 16, poll_s: float = 0.01,
                 share_from: int = 2) -> None:
        self.state = state
        self.send = send
        self.ttl_s = ttl_s
        self.max_helpers = max_helpers
        self.local = max_helpers == 0
        self.poll_s = poll_s
        self.share_from = max(2, share_from)  # units a phase needs before it is shared at all

    def run(self, applier: UnitRunner, block: Block, phase: str, ctx: dict[str, int],
            specs: list[dict[str, Any]]) -> list[Result]:
        if len(specs) < self.share_from or self.max_helpers == 0:  # run here: no board, no messages
            return LocalFanout().run(applier, block, phase, ctx, specs)
        run, holder = uuid.uuid4().hex, holder_id()
        self.state.post_units(block.hash, phase, run, specs)
        try:
            self._call_helpers(block, phase, run, ctx, min(len(specs) - 1, self.max_helpers))
            take_over: str | None = None
            poll = self.poll_s
            refused = False
            while True:
                # after a refusal nothing more is started (not even a lapsed unit): only waited for
                applier.heartbeat()
                if not refused and work_units(self.state, applier, block.hash, lambda: block, phase, run,
                                              ctx, holder, self.ttl_s, take_over, applier.heartbeat):
                    poll = self.poll_s
                units = self.state.unit_states(block.hash, phase, run)
                if len(units) != len(specs):  # another coordinator replaced or dropped the posting
                    raise StorageError(f"{phase} phase of block {block.hash_hex}: another worker took "
                                       "the block over (its units were reposted)")
                refused = any("refused" in (u.result or {}) for u in units)
                if all(u.state in (DONE, CANCELLED) for u in units):
                    break
                take_over = next((u.holder for u in units if u.state == HELD and holder_gone(u.holder)), None)
                if take_over is None or refused:
                    time.sleep(poll)  # others are running their units
                    poll = min(poll * 2, 0.2)
        finally:
            self.state.drop_units(block.hash, phase, run)  # never left behind, whatever happened
        results = [u.result or {} for u in units if u.state == DONE]
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise StorageError(f"{phase} phase of block {block.hash_hex}: {errors[0]}")
        if not refused and any(u.state == CANCELLED for u in units):
            raise StorageError(f"{phase} phase of block {block.hash_hex}: units were cancelled, "
                               "yet none refused the block (another worker took it over?)")
        return results

    def _call_helpers(self, block: Block, phase: str, run: str, ctx: dict[str, int], n: int) -> None:
        try:
            for _ in range(n):
                self.send(f"utxoflow.chunk.{phase}", [block.hash_hex, phase, run, ctx])
        except Exception as e:  # helpers only speed things up: this worker runs every unit itself
            log.warning("could not send %s helper tasks for block %s: %s", phase, block.hash_hex, e)


def help_with(state: StateStore, applier: UnitRunner, load: Callable[[bytes], Block], block_hex: str,
              phase: str, run: str, ctx: dict[str, int], ttl_s: float = 120.0) -> int:
    """A helper task's work: run units of the posting until none is left; how many it ran.
    `load` must give only a block whose transactions match its header (Sequencer.genuine): a
    corrupted copy, where the coordinator may hold the genuine one, raises StorageError, and
    the unit is given back."""
    h = bytes.fromhex(block_hex)[::-1]
    return work_units(state, applier, h, lambda: load(h), phase, run, ctx, holder_id(), ttl_s)


def settle_block(state: StateStore, block_hash: bytes, wait_s: float, poll_s: float = 0.05) -> None:
    """Before a block is taken back: cancel every posting of it (a coordinator that died left
    its posting live), wait until no live claim can still write (holders that are dead
    processes of this host are not waited for; others at most until their claims lapse), then
    forget the postings."""
    state.cancel_block(block_hash)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if all(holder_gone(h) for h in state.live_holders(block_hash)):
            break
        time.sleep(poll_s)
    state.drop_units(block_hash)
