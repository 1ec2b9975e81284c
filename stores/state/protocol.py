"""What the chain sequencer keeps between blocks (docs/architecture.md, "The chain").

Invariants every backend keeps (tests/state checks each):
- A block is added once (create-only); its hash, parent and arrival order never change.
- `best_candidate` is the connected block of most cumulative work that is neither invalid nor
  an orphan; among equals, the first seen (lowest arrival order) wins, so ties keep the chain.
- An undo record is written before a block's first change and read back whole.
- `commit` changes blocks, the tip, undo records, meta values, commitments and prepared deltas
  in one transaction: a reader never sees a block applied above the tip, or the tip on a block
  not applied, or an applied block without the commitment it was applied with.
- A lease has at most one holder until it expires; so has a chunk unit (see chunks.py).
- A recovery entry's claim and release follow stores/state/recovery.py; a terminal entry
  never changes again.
- A pending message (`PendingEntry`) stays until it is removed, whatever happens to the broker;
  `claim_pending` hands an entry to one caller only (two scans racing never both re-send it)
  and marks it sent, now, under the broker run the caller names.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from chain import hash_to_hex
from stores.state.chunks import Unit, UnitState
from stores.state.prunejobs import PruneJob, Requested
from stores.state.recovery import RecoveryEntry
from stores.state.sessionlock import AdvisoryLock


class BlockStatus(enum.StrEnum):
    PENDING = "pending"  # connected, on or off the best chain, not applied (yet)
    APPLIED = "applied"  # applied to the UTXO store: on the best chain, at or below the tip
    SIDE = "side"  # connected and valid so far, on a lighter branch (or reorganised away)
    ORPHAN = "orphan"  # its parent has not arrived
    INVALID = "invalid"  # refused whole (see `reason`), with every descendant


@dataclass(frozen=True, slots=True)
class BlockEntry:
    hash: bytes
    parent: bytes
    height: int | None  # None while an orphan
    work: int | None  # cumulative proof of work up to this block; None while an orphan
    status: BlockStatus
    reason: str | None
    block_id: int  # small integer naming the block in the UTXO store's block lists
    seq: int  # arrival order
    n_txs: int

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "hash": hash_to_hex(self.hash), "height": self.height, "status": self.status.value,
        }
        if self.reason:
            d["reason"] = self.reason
        return d


@dataclass(frozen=True, slots=True)
class BlockChange:
    """New values for one block's entry (None: left as it is)."""

    hash: bytes
    status: BlockStatus | None = None
    reason: str | None = None
    height: int | None = None
    work: int | None = None


@dataclass(frozen=True, slots=True)
class Commitment:
    """The confirmed UTXO set as a block left it (`workers.chainstate.commitment`): its MuHash3072 state
    (`chain.muhash.MuHash.to_bytes`, 384 bytes: the next block continues from it), and how many
    outputs and satoshis it holds."""

    muhash: bytes
    utxos: int
    satoshis: int


@dataclass(frozen=True, slots=True)
class PreparedDelta:
    """A block's change to the confirmed set's commitment, worked out ahead of the chain by a
    worker that does not hold it (`workers.chainstate.prepare`): the MuHash of its coins in over its coins
    out (384 bytes), the change in outputs and satoshis, and `basis`, what it holds for (the
    chain's base and the block's height: `workers.chainstate.prepare.basis`)."""

    basis: str
    muhash: bytes
    utxos: int
    satoshis: int


KEEP: Any = object()  # `commit`'s tip argument: leave the tip where it is


PENDING_KINDS = ("block", "tx")


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """A message enqueued and not yet finished for good (workers/runtime/registry.py)."""

    ident: str  # the message's id, "<kind>:<key>" as `utxo enqueue` makes it
    kind: str  # one of PENDING_KINDS: which task the message is for
    key: str  # the block hash or txid (display hex): the task's argument
    seq: int  # registration order (kept when the same ident is added again)
    enqueued_at: float  # seconds since the epoch: first added
    sent_at: float  # seconds since the epoch: last (re-)sent
    broker_run: str  # the broker's identity when last sent ("" unknown): a new one lost the queue
    sends: int  # how many times it has been sent


class PendingDone(NamedTuple):
    """A message finished for good (`remove_pending_many`): with `accepted`, its tx's record was
    made; with `refused` (reason, rival txid or None), it was refused."""

    ident: str
    accepted: bool = False
    refused: tuple[str, str | None] | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A message finished as refused (stores/state/refusals.py): its id, kind and key, why, and
    the rival that holds what it wanted (a txid, display hex), if one does."""

    ident: str
    kind: str
    key: str
    reason: str
    rival: str | None
    at: float  # seconds since the epoch
    seq: int  # the log's order (0: not from the log)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "key": self.key, "reason": self.reason}
        if self.rival:
            d["rival"] = self.rival
        return d


@runtime_checkable
class StateStore(Protocol):
    url: str

    def add_block(
        self, hash: bytes, parent: bytes, height: int | None, work: int | None, status: BlockStatus,
        n_txs: int, reason: str | None = None,
    ) -> BlockEntry:
        """Create-only: the stored entry (the existing one if the hash is known)."""

    def get_block(self, hash: bytes) -> BlockEntry | None: ...
    def update_block(
        self, hash: bytes, *, status: BlockStatus | None = None, reason: str | None = None,
        height: int | None = None, work: int | None = None,
    ) -> None: ...
    def children(self, parent: bytes) -> list[BlockEntry]: ...
    def best_candidate(self) -> BlockEntry | None: ...
    def tip(self) -> BlockEntry | None: ...
    def set_tip(self, hash: bytes | None) -> None: ...
    def is_empty(self) -> bool: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str | None) -> None:
        """Set (None: remove) a small named value of the chain (e.g. the block being applied)."""
    def counts(self) -> dict[str, int]: ...
    def last_blocks(self, status: BlockStatus, limit: int = 10) -> list[BlockEntry]:
        """The blocks last indexed that have `status` now (invalid ones with their reasons),
        newest first."""
        ...
    def block_summary(self) -> dict[str, tuple[int, int | None]]:
        """Blocks per status: (how many, the highest height among them)."""

    def commit(
        self,
        *,
        blocks: Sequence[BlockChange] = (),
        tip: bytes | None = KEEP,
        undo: Mapping[bytes, dict[str, Any] | None] = {},
        meta: Mapping[str, str | None] = {},
        prune_undo_below: int | None = None,
        commitments: Mapping[bytes, Commitment] = {},
        deltas: Mapping[bytes, PreparedDelta | None] = {},
    ) -> None:
        """All of these in one transaction: block entries changed, the tip moved (None: no
        tip), undo records written (None: deleted), meta values set (None: removed), the
        undo records of applied blocks at or below `prune_undo_below` deleted (and the
        prepared deltas of every block there), blocks' commitments written (replacing what a
        block had), and prepared deltas written (replacing) or deleted (None)."""

    def get_commitment(self, hash: bytes) -> Commitment | None:
        """The commitment the block was last applied with (kept when it leaves the chain)."""

    def get_delta(self, hash: bytes) -> PreparedDelta | None:
        """The block's prepared delta, if one was written and not deleted since."""

    def demote_pending(self, work: int) -> int:
        """`pending` blocks of no more work than `work` (the tip's) are `side`; how many."""

    def put_undo(self, hash: bytes, data: dict[str, Any]) -> None: ...
    def get_undo(self, hash: bytes) -> dict[str, Any] | None: ...
    def delete_undo(self, hash: bytes) -> None: ...

    def session_lock(self, lock_id: int) -> AdvisoryLock | None:
        """A lock held while a database session of its own lives (stores/state/sessionlock.py),
        where the backend has one (PostgreSQL's advisory locks); None elsewhere (use a lease)."""

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the lease `name` for `holder`; False while another holds it."""

    def lease_holder(self, name: str) -> str | None: ...
    def release_lease(self, name: str, holder: str) -> None: ...

    # The chunk board (stores/state/chunks.py): a block phase's units, claimed by workers.
    def post_units(self, block: bytes, phase: str, run: str, specs: list[dict[str, Any]]) -> None: ...
    def claim_unit(self, block: bytes, phase: str, run: str, holder: str, ttl_s: float,
                   take_over: str | None = None) -> Unit | None: ...
    def finish_unit(self, block: bytes, phase: str, run: str, idx: int, holder: str,
                    result: dict[str, Any] | None) -> bool: ...
    def cancel_units(self, block: bytes, phase: str, run: str) -> None: ...
    def unit_states(self, block: bytes, phase: str, run: str) -> list[UnitState]: ...
    def drop_units(self, block: bytes, phase: str | None = None, run: str | None = None) -> None: ...
    def cancel_block(self, block: bytes) -> None: ...
    def live_holders(self, block: bytes) -> list[str]: ...

    # The registry of pending messages (stores/state/pending.py, workers/runtime/registry.py).
    def add_pending(self, ident: str, kind: str, key: str, broker_run: str) -> None:
        """Register a message about to be sent (ValueError: unknown kind). An ident already
        pending keeps its place and enqueued time; its sent time, run and count are updated.
        A tx also gets its recovery entry (`recovery_add`), in the same transaction."""

    def add_pending_many(
        self, entries: Sequence[tuple[str, str, str]], broker_run: str,
        kept: Mapping[str, bytes] | None = None,
    ) -> None:
        """`add_pending` of each (ident, kind, key), in one transaction (a batch of messages);
        `kept`: the bytes of transactions among them (ident → bytes), kept in that transaction
        while they may be needed (stores/state/txbytes.py)."""

    def tx_bytes(self, idents: Sequence[str]) -> dict[str, bytes]:
        """The bytes kept for these message ids (those that have any)."""

    def sweep_tx_bytes(self) -> int:
        """Delete the bytes no pending message or pending recovery entry needs; how many."""

    def sweep_waits(self) -> int:
        """Delete the reasons of messages no longer pending (none is left by the writes that
        finish a message; this is a backstop); how many."""

    def remove_pending(
        self, ident: str, accepted: bool = False, refused: tuple[str, str | None] | None = None
    ) -> None:
        """The message is finished for good (removing what is not there is harmless); with
        `accepted`, its tx's record was made, noted on its recovery entry in the same
        transaction (from then on the record's absence means it was removed), and an earlier
        refusal of it forgotten; with `refused` (reason, rival), it was refused: logged in the
        same transaction (stores/state/refusals.py)."""

    def remove_pending_many(self, done: Sequence[PendingDone]) -> None:
        """`remove_pending` of each, in one transaction (a batch of transactions finished)."""

    def refusals(self, idents: Sequence[str]) -> dict[str, Refusal]:
        """The logged refusals of these message ids (those refused)."""

    def last_refusals(self, limit: int = 10) -> list[Refusal]:
        """The latest refusals logged, newest first."""

    def note_refusal(self, ident: str, kind: str, key: str, reason: str, rival: str | None = None) -> None:
        """Log a refusal on its own (a block's: stores/state/refusals.py)."""

    def forget_refusals(self, idents: Sequence[str]) -> None:
        """Drop the logged refusals of these ids (blocks an operator reconsidered)."""

    def refusals_since(self, seq: int, limit: int = 1000) -> list[Refusal]:
        """The refusals logged after `seq`, oldest first, at most `limit`."""

    def note_waiting(self, reasons: Sequence[tuple[str, str]]) -> None:
        """Say why each of these pending messages (ident, reason) waits (a tx's missing
        parents); one no longer pending is left out, one noted before keeps its first time."""

    def waiting(
        self, idents: Sequence[str] | None = None, limit: int = 20
    ) -> tuple[int, dict[str, tuple[str, float]]]:
        """How many pending messages (of `idents`, or all) say why they wait, and the `limit`
        that have waited longest: ident → (reason, since: seconds since the epoch)."""

    def pending_counts(self) -> dict[str, int]:
        """Messages pending per kind."""

    def pending(
        self, upto: int | None = None, *, kind: str | None = None, sent_before: float | None = None,
        limit: int | None = None,
    ) -> list[PendingEntry]:
        """Pending entries in registration order; with `upto`, only those whose seq ≤ it; with
        `kind`, of that kind; with `sent_before` (seconds since the epoch), last sent before it;
        at most `limit`."""

    def claim_pending(
        self, broker_run: str | None, older_than_s: float, limit: int, after: int = 0
    ) -> list[PendingEntry]:
        """The first `limit` entries (registration order) past seq `after` that were sent under
        another broker run than `broker_run` (None: the run is not known, only age counts) or
        more than `older_than_s` seconds ago; each is marked sent now under `broker_run` (count
        + 1) in the same transaction, and returned as it was before."""

    def unclaim_pending(self, idents: list[str]) -> None:
        """These claimed entries were not sent after all: the next claim takes them whatever
        the broker run or age; entries no longer pending are left out."""

    # -- the recovery manager's claims (stores/state/recovery.py) -------------------------------
    def recovery_add(self, kind: str, keys: Sequence[str]) -> int: ...
    def recovery_claim(
        self, holder: str, lease_s: float, older_than_s: float, limit: int
    ) -> list[RecoveryEntry]: ...
    def recovery_release(
        self, ident: str, holder: str, outcome: str, status: str = "pending", accepted: bool = False
    ) -> bool: ...
    def recovery_count(self, kind: str, outcome: str, n: int = 1) -> None: ...
    def recovery_entry(self, ident: str) -> RecoveryEntry | None: ...
    def recovery_summary(self, last: int = 20) -> dict[str, Any]: ...

    # -- the pruner's jobs (stores/state/prunejobs.py) -------------------------------------------
    def prune_request(self, height: int, timeout_s: float) -> Requested: ...
    def prune_take(self, holder: str, ttl_s: float, timeout_s: float) -> PruneJob | None: ...
    def prune_renew(self, job_id: int, holder: str, ttl_s: float, figures: dict[str, Any]) -> bool: ...
    def prune_finish(self, job_id: int, holder: str, status: str, figures: dict[str, Any],
                     error: str | None = None) -> bool: ...
    def prune_jobs(self, limit: int = 20) -> list[PruneJob]: ...
    def prune_job(self, job_id: int) -> PruneJob | None: ...
    def prune_open_jobs(self) -> tuple[PruneJob | None, PruneJob | None]: ...
    def prune_done_height(self) -> int | None: ...
    def blocks_settled_between(self, above: int, upto: int) -> list[tuple[bytes, int]]: ...

    def close(self) -> None: ...
