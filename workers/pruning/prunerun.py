"""One pruning run at a height (Teranode's pruner service, "a run"): the checks, preserving parents, deleting
what is due, and the block bodies below the retention.

Invariants:
- Nothing is deleted while the chain is being reorganised (a disconnection or a rebase is
  noted: looked at when the run starts and at each lease renewal), while the tip is below the
  run's height, or while the chain's start is unknown (a block arriving below the base would
  take every applied block back, and needs their records): the job says why it skipped.
- Parents of old unmined transactions are preserved before anything is deleted, and any failure
  there fails the run before a single deletion.
- Deletion walks the due records with a cursor (delete-at-height, id), a chunk per write unit:
  a record kept (defensive mode, a blob that would not go) is not met again in the run, and the
  next run looks at it afresh.
- Where the store takes concurrent writers and the pruner is `shared`, a group's chunks are
  units of the state store's chunk board that helper tasks claim too (`work_chunks`; each chunk
  a list of txids for `UtxoStore.prune`, which re-checks each record under lock). The runner
  claims units itself, so a run never waits on a helper that does not come.
- Otherwise (SQLite: one writer at a time) the chunks go one after another, each a write unit
  that finds its records under its own lock (`UtxoStore.prune_next`). Not the whole group in
  one unit: measured, 10,000-record units were no faster in `bench.prune` than 1,000-record
  ones, and held SQLite's write lock long enough (over a second) to push block tasks past
  their time budget.
- Block bodies go for blocks settled (applied, side, invalid) at or below height − retention,
  in height order; the height below which every body is gone is kept in state meta, so each
  body is removed once. A body that cannot be removed stops that phase for this run; the next
  one goes on from its height. (A block still pending when its height passed the retention —
  a side branch never settled — keeps its body.)
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stores.blob.protocol import blob_key
from stores.errors import StorageError
from stores.lease import holder_gone
from stores.state.chunks import DONE
from stores.state.prunejobs import PruneJob
from stores.utxo.values import PruneResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from stores.blob.protocol import BlobStore
    from stores.state import StateStore
    from stores.utxo import UtxoStore

log = logging.getLogger("utxoflow.pruner")


@dataclass(frozen=True)
class PrunerConfig:
    retention: int  # UTXO_BLOCK_HEIGHT_RETENTION (0: nothing is ever pruned)
    unmined_tx_retention: int
    parent_preservation_blocks: int
    chunk_size: int = 1000
    chunk_group_limit: int = 10
    progress_log_interval: float = 30.0
    defensive: bool = False
    job_timeout: float = 600.0
    lease_s: float = 30.0
    dah_cleaner: bool = True  # False: runs preserve parents but delete nothing (UTXO_DISABLE_DAH_CLEANER)
    auto: bool = True  # blocks request runs (off with the DAH cleaner disabled)

    @classmethod
    def from_settings(cls, s: Any) -> PrunerConfig:
        return cls(
            retention=s.block_height_retention,
            unmined_tx_retention=s.unmined_tx_retention,
            parent_preservation_blocks=s.parent_preservation_blocks,
            chunk_size=s.pruner_chunk_size,
            chunk_group_limit=s.pruner_chunk_group_limit,
            progress_log_interval=s.pruner_progress_log_interval,
            defensive=s.pruner_defensive_enabled,
            job_timeout=s.pruner_job_timeout,
            dah_cleaner=not s.disable_dah_cleaner,
            auto=not s.disable_dah_cleaner and s.block_height_retention > 0,
        )


class Pruner(Protocol):
    """What a run needs of its pruner (`workers.pruning.pruner.Pruner`): its stores, settings, and how
    it shares chunks."""

    utxo: UtxoStore
    state: StateStore
    blobs: BlobStore
    config: PrunerConfig
    shared: bool
    send: Callable[[str, list[Any]], None] | None
    start_known: Callable[[], bool]

CHUNK_TASK = "utxoflow.prune.chunk"
PHASE = "prune"
BODIES_DONE = "prune_bodies_done"  # state meta: block bodies removed up to this height
DISCONNECTING, REBASE = "disconnecting", "rebase"  # the sequencer's and the index's marks


class LeaseLost(StorageError):
    """The run's job is no longer this runner's (failed by a taker), or it passed the timeout."""


class Skip(Exception):
    """The run must not delete now (the reason is the message)."""


class PruneRun:
    def __init__(self, pruner: Pruner, job: PruneJob, holder: str) -> None:
        self.p = pruner
        self.job = job
        self.holder = holder
        self.height = job.height
        self.t0 = time.monotonic()
        self._renewed = self.t0
        self._logged = self.t0
        self.figures: dict[str, Any] = {"height": job.height}

    def execute(self) -> None:
        self.check()
        self.preserve()
        self.delete()
        self.bodies()

    # -- the lease ----------------------------------------------------------------------------
    def renew(self, force: bool = False) -> None:
        """Between chunks: stop past the job timeout; every quarter of the lease, renew it and
        look again for a reorg begun since the run started (it stops the run: skipped)."""
        now = time.monotonic()
        if now - self.t0 >= self.p.config.job_timeout:
            raise LeaseLost(f"past the job timeout ({self.p.config.job_timeout:g} s)")
        if force or now - self._renewed >= self.p.config.lease_s / 4:
            if not self.p.state.prune_renew(self.job.id, self.holder, self.p.config.lease_s, self.figures):
                raise LeaseLost("another worker failed this job (its lease had lapsed)")
            self._renewed = now
            self._reorg()

    def _reorg(self) -> None:
        for mark, what in ((DISCONNECTING, "a block is being disconnected (a reorg)"),
                           (REBASE, "the chain is being rebased")):
            if self.p.state.get_meta(mark) is not None:
                raise Skip(what)

    # -- 1. may it run? -------------------------------------------------------------------------
    def check(self) -> None:
        state = self.p.state
        self._reorg()
        tip = state.tip()
        if tip is None or tip.height is None or tip.height < self.height:
            at = "nothing" if tip is None else f"height {tip.height}"
            raise Skip(f"mining has not reached height {self.height} (the tip is at {at})")
        if not self.p.start_known():
            raise Skip("the chain's start is not known: a block below its base would take every "
                       "applied block back, and needs their records")
        if self.p.config.retention <= 0:
            raise Skip("the retention is 0: records are never pruned")

    # -- 2. preserve the parents of old unmined transactions --------------------------------------
    def preserve(self) -> None:
        t = time.monotonic()
        cfg, utxo = self.p.config, self.p.utxo
        cutoff = self.height - cfg.unmined_tx_retention
        old = utxo.query_old_unmined(cutoff) if cutoff >= 0 else []
        until = self.height + cfg.parent_preservation_blocks
        parents = 0
        for i in range(0, len(old), cfg.chunk_size):
            found = sorted(utxo.parents_of(old[i : i + cfg.chunk_size]))
            utxo.preserve_transactions(found, until)  # (a failure raises: nothing is deleted)
            parents += len(found)
            self.renew()
        expired = utxo.process_expired_preservations(self.height)
        self.figures["preserve"] = {
            "old_unmined": len(old), "parents_preserved": parents, "expired_preservations": expired,
            "seconds": round(time.monotonic() - t, 3),
        }  # fmt: skip

    # -- 3. delete what is due ----------------------------------------------------------------------
    def delete(self) -> None:
        t = time.monotonic()
        cfg = self.p.config
        total = PruneResult()
        fig: dict[str, Any] = {"seen": 0, **total.to_json(), "chunks": 0}
        self.figures["delete"] = fig
        if not cfg.dah_cleaner:
            fig["disabled"] = True
            return
        stable_at = self.height - cfg.retention if cfg.defensive else None
        after: Any = None  # the store's cursor
        group = cfg.chunk_size * cfg.chunk_group_limit
        while True:
            if self.p.shared:  # a group of chunks, listed here, shared with helper tasks
                page, after = self.p.utxo.due_page(self.height, after, group)
                if not page:
                    break
                size = cfg.chunk_size
                chunks = [page[i : i + size] for i in range(0, len(page), size)]
                results = self._run_chunks(chunks, stable_at)
            else:  # a unit at a time, found by the unit itself (see the invariants)
                r, after = self.p.utxo.prune_next(self.height, after, cfg.chunk_size, stable_at)
                if after is None:
                    break
                results, chunks = [r], [[]]
            seen = sum(r.deleted + r.not_due + r.defensive_kept + r.blob_kept for r in results)
            for r in results:
                total.add(r)
            fig.update(seen=fig["seen"] + seen, chunks=fig["chunks"] + len(chunks), **total.to_json())
            self.renew()
            if cfg.progress_log_interval and time.monotonic() - self._logged >= cfg.progress_log_interval:
                self._logged = time.monotonic()
                log.info("prune job %d: %d records seen, %d deleted so far",
                         self.job.id, fig["seen"], total.deleted)
        fig["seconds"] = round(time.monotonic() - t, 3)

    def _run_chunks(self, chunks: list[list[bytes]], stable_at: int | None) -> list[PruneResult]:
        if len(chunks) < 2:
            out = []
            for c in chunks:
                out.append(self.p.utxo.prune(c, self.height, stable_at))
                self.renew()
            return out
        return self._shared(chunks, stable_at)

    def _shared(self, chunks: list[list[bytes]], stable_at: int | None) -> list[PruneResult]:
        """The chunks as units of the chunk board, helpers called, this runner working too."""
        state, key = self.p.state, board_key(self.job.id)
        run = uuid.uuid4().hex
        state.post_units(key, PHASE, run, [{"txids": [t.hex() for t in c]} for c in chunks])
        try:
            try:
                for _ in range(len(chunks) - 1):
                    assert self.p.send is not None
                    self.p.send(CHUNK_TASK, [key.hex(), run, self.height, stable_at])
            except Exception as e:  # helpers only speed it up: this runner can run every chunk
                log.warning("could not send prune chunk tasks: %s", e)
            take_over: str | None = None
            while True:
                work_chunks(self.p, key, run, self.height, stable_at, self.holder, take_over, self.renew)
                units = state.unit_states(key, PHASE, run)
                if all(u.state == DONE for u in units):
                    break
                take_over = next((u.holder for u in units if u.holder and holder_gone(u.holder)), None)
                if take_over is None:
                    time.sleep(0.05)
                self.renew()
        finally:
            state.drop_units(key, PHASE, run)
        errors = [u.result["error"] for u in units if u.result and "error" in u.result]
        if errors:
            raise StorageError(f"a prune chunk failed: {errors[0]}")
        return [PruneResult(**(u.result or {})) for u in units]

    # -- 4. block bodies below the retention ----------------------------------------------------
    def bodies(self) -> None:
        state = self.p.state
        if not self.p.config.dah_cleaner:
            self.figures["bodies"] = {"disabled": True}
            return
        upto = self.height - self.p.config.retention
        done = state.get_meta(BODIES_DONE)
        above = -1 if done is None else int(done)
        removed, error, last = 0, None, above
        if upto > above:
            blocks = state.blocks_settled_between(above, upto)
            try:
                for h, height in blocks:
                    if height - 1 > last:  # every body below `height` is gone
                        last = height - 1
                    self.p.blobs.delete(blob_key(h, "block"))
                    removed += 1
                    if removed % 100 == 0:
                        self.renew()
                last = upto
            except StorageError as e:  # the next run goes on from the height that failed
                error = str(e)
                log.warning("prune job %d: block bodies stop here: %s", self.job.id, e)
            if last > above:
                state.set_meta(BODIES_DONE, str(last))
        self.figures["bodies"] = {"removed": removed, **({"error": error} if error else {})}


def board_key(job_id: int) -> bytes:
    """The chunk board's 32-byte key for a job's units (the board is keyed like a block)."""
    return hashlib.sha256(f"prune-job:{job_id}".encode()).digest()


def work_chunks(pruner: Pruner, key: bytes, run: str, height: int, stable_at: int | None, holder: str,
                take_over: str | None = None, beat: Any = None) -> int:
    """Claim and run a posting's chunks until none is left to claim; how many this ran. A chunk
    that fails records its error as its result (the runner fails the job with it)."""
    state = pruner.state
    ran = 0
    while True:
        unit = state.claim_unit(key, PHASE, run, holder, pruner.config.lease_s, take_over)
        if unit is None:
            return ran
        take_over = None
        try:
            result: dict[str, Any] = pruner.utxo.prune(
                [bytes.fromhex(t) for t in unit.spec["txids"]], height, stable_at
            ).to_json()
        except StorageError as e:
            result = {"error": str(e)}
        ran += 1
        state.finish_unit(key, PHASE, run, unit.idx, holder, result)
        if beat is not None:
            beat()
