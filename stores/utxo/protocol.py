"""The UTXO store Protocol: every backend (SQLite, PostgreSQL, later Aerospike) implements it.

Shape: batch calls first (a block's worth of transactions per call), each atomic per record and
reporting per-item results, so that it maps onto Aerospike batch operations with Lua UDFs as
well as onto SQL transactions. The single-item methods are thin conveniences over the batch ones.

Contract every backend keeps (the conformance suite in tests/stores checks each): it runs the
rules of the record kernel (`stores.utxo.kernel`) and nothing else.
- create is create-only: an existing txid is TxExists and changes nothing.
- a spend either records every input of the transaction or none of them.
- the same spender spending the same output again is a success (Celery delivers at least once),
  unless that spender was pruned since (INVALID_SPEND).
- delete_at_height is set only when `kernel.dah` says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from chain import Tx
from stores.errors import StoreError
from stores.utxo.errors import UtxoError
from stores.utxo.kernel.spend import NO_IGNORE, Ignore
from stores.utxo.scriptindex import Balance, ScriptUtxo
from stores.utxo.twophase import Creation, PagedRecords
from stores.utxo.values import (
    BlockInfo,
    CreationLock,
    OutputInfo,
    PruneResult,
    Spend,
    Spenders,
    SpendInfo,
    Standing,
    TxMeta,
    Utxo,
    UtxoStats,
)

Outpoint = tuple[bytes, int]


@runtime_checkable
class UtxoStore(PagedRecords, Protocol):
    """Everything a backend offers; the record-level calls of two-phase creation (and
    `batch_size`: outputs per record, fixed when the store was created) come from
    `PagedRecords`, the coordinator's view of a backend."""

    url: str
    block_height: int
    retention: int
    # whether writers in several processes proceed at once (False: SQLite's one write lock, so
    # work is not worth sharing out, and fewer, larger write units are cheaper)
    concurrent_writers: bool

    # -- creation ---------------------------------------------------------------------------
    def create_many(
        self,
        txs: Sequence[Tx],
        block_height: int,
        mined_block_infos: Sequence[BlockInfo] = (),
        locked: bool = False,
        conflicting: bool = False,
        frozen: bool = False,
        meta: bool = True,
    ) -> Sequence[TxMeta | StoreError | None]:
        """Per tx, its record as created (None with `meta` off) or its error."""

    def create(
        self,
        tx: Tx,
        block_height: int,
        mined_block_infos: Sequence[BlockInfo] = (),
        locked: bool = False,
        conflicting: bool = False,
        frozen: bool = False,
    ) -> TxMeta: ...

    def begin_paged(self, tx: Tx, block_height: int, batch: Sequence[Tx] = ()) -> Creation:
        """Steps 1–3 of two-phase creation for a multi-record tx (lock, blob, master page;
        previous outputs found in `batch` or the store make the blob extended), so that its
        child pages can be written by several workers (`twophase.write_pages`) before
        `twophase.end_creation`. TxExists as `create`."""

    def import_utxos(
        self,
        utxos: Iterable[Utxo],
        block_id: int = 0,
        *,
        height: int | None = None,
        block_hash: bytes | None = None,
    ) -> int: ...
    def is_empty(self) -> bool: ...
    def identity(self) -> str:
        """This store's id: made on the first ask, then kept for good (create-only, so that two
        workers asking at once get the same). The state store keeps the id of the UTXO store it
        belongs with (`workers.chainstate.pairing`)."""
        ...


    # -- reads ------------------------------------------------------------------------------
    def get(self, txid: bytes, fields: Sequence[str] | None = None) -> TxMeta: ...
    def existing(self, txids: Sequence[bytes], conflicting: bool = False) -> set[bytes]: ...
    def mined(self, txids: Sequence[bytes]) -> set[bytes]: ...
    def standing(self, txids: Sequence[bytes]) -> dict[bytes, Standing]:
        """Those of `txids` the store holds, each with whether it is mined on the longest chain
        and whether it is conflicting: `existing` and `mined` in one read."""
        ...
    def snapshot_block(self) -> tuple[int, bytes] | None: ...
    def get_spend(self, outpoint: Outpoint, utxo_hash: bytes) -> SpendInfo: ...
    def get_output(self, outpoint: Outpoint) -> OutputInfo | None: ...
    def get_outputs(self, outpoints: Sequence[Outpoint]) -> dict[Outpoint, OutputInfo]: ...
    def spenders(self, outpoints: Sequence[Outpoint]) -> Spenders:
        """The stored spender of each of `outpoints` the store holds (None: unspent), and which
        parents of those outpoints are conflicting, read afresh; the slots and flags alone, so
        no output bytes or blobs are read."""
        ...
    def iter_utxos(self, *, confirmed: bool = True, script: bytes | None = None) -> Iterator[Utxo]: ...
    def stats(self) -> UtxoStats: ...
    def script_utxos(
        self, scripthash: bytes, *, after: str | None = None, limit: int = 1000, confirmed: bool = False
    ) -> tuple[list[ScriptUtxo], str | None]:
        """A page of the script index (`stores.utxo.scriptindex`): the unspent outputs of the script
        whose SHA-256 is `scripthash` (only confirmed ones, if asked), in index order, after the
        cursor `after`; and the cursor to go on from (None: none is left)."""
    def script_balance(self, scripthash: bytes) -> Balance: ...

    # -- spends -----------------------------------------------------------------------------
    def spend_many(
        self,
        txs: Sequence[Tx],
        block_height: int,
        missing_ok: bool = False,
        ignore: Ignore = NO_IGNORE,
        by_block: bool = False,
    ) -> list[list[Spend] | UtxoError]:
        """Spend every input of each tx, all or nothing per tx. `by_block`: the spends are a
        block's; a store whose spend is not one unit across records keeps a refused delivery of
        the same transaction from taking them back (see `stores.utxo.aerospike.rules`)."""
        ...
    def spend(self, tx: Tx, block_height: int, ignore: Ignore = NO_IGNORE) -> list[Spend]: ...
    def unspend(
        self, spends: Sequence[Spend], lock_parents: bool = False, exact: bool = False
    ) -> list[UtxoError | None]:
        """Take back each spend whose output has the given UTXO hash, whoever made it; with
        `exact`, only while its slot still holds that spend's own spender and vin (and not one
        the parent lists as pruned: `kernel.spend.take_back`), anything else left as it is."""
        ...

    def take_back_dead(self, tx: Tx) -> int:
        """Free the inputs `tx` still holds, only while it has no record and only those slots
        that hold its own spend: what an attempt of it that died between its spend and its
        record left, once a later delivery of it was refused. How many were freed."""
        ...

    # -- block membership -------------------------------------------------------------------
    def set_mined_multi(
        self,
        txids: Sequence[bytes],
        block_id: int,
        block_height: int,
        subtree_idx: int = 0,
        on_longest_chain: bool = True,
        unset: bool = False,
    ) -> list[list[int] | UtxoError]: ...

    def mark_on_longest_chain(self, txids: Sequence[bytes], on: bool) -> None: ...

    # -- state changes ----------------------------------------------------------------------
    def set_locked(self, txids: Sequence[bytes], value: bool) -> None: ...
    def set_conflicting(self, txids: Sequence[bytes], value: bool) -> None: ...
    def freeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]: ...
    def unfreeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]: ...
    def reassign(self, outpoint: Outpoint, utxo_hash: bytes, new_utxo_hash: bytes) -> None: ...
    def preserve_transactions(self, txids: Sequence[bytes], until: int) -> None: ...
    def process_expired_preservations(self, height: int) -> int: ...
    def query_old_unmined(self, cutoff: int) -> list[bytes]: ...
    def set_block_height(self, height: int) -> None: ...
    def current_height(self) -> int:
        """The store's height, read afresh (`block_height` is this object's last view of it)."""

    # -- two-phase creation: the record-level calls are `PagedRecords`'s ------------
    def get_creation_lock(self, txid: bytes) -> CreationLock | None: ...
    def half_done_creations(self, limit: int = 1000) -> list[bytes]:
        """Up to `limit` txids (sorted) whose creation nobody is finishing: a master still
        `creating` with no live lock, or a lapsed lock with no master. The recovery manager
        finishes them (`complete_creation`), or clears a lapsed lock that left nothing."""
        ...

    def complete_creation(self, txid: bytes, block_height: int | None = None) -> bool:
        """Finish a half-done multi-record creation (a reader that meets `creating` may ask)."""
        ...

    # -- pruning ----------------------------------------------------------------------------
    def query_dah(self, height: int, limit: int = 1000) -> list[bytes]: ...
    def due_page(
        self, height: int, after: Any = None, limit: int = 1000
    ) -> tuple[list[bytes], Any]:
        """Txids due at `height` after the opaque cursor `after`; the cursor to go on from (None:
        none is left)."""
    def parents_of(self, txids: Sequence[bytes]) -> set[bytes]: ...
    def delete_expired(self, txids: Sequence[bytes], height: int) -> int: ...
    def prune_next(
        self, height: int, after: Any, limit: int, stable_at: int | None = None
    ) -> tuple[PruneResult, Any]:
        """`prune` of the next `limit` records due after the cursor `after` (found under the
        unit's own lock); the cursor to go on from, None when none is left."""
    def prune(self, txids: Sequence[bytes], height: int, stable_at: int | None = None) -> PruneResult:
        """Delete those of `txids` due at `height` (their blobs first; a blob that cannot go keeps
        its record), noting each on the parents that stay; `stable_at`: defensive mode, keeping a
        record while a spender is not mined at or below it."""
    def delete_txs(self, txids: Sequence[bytes]) -> int: ...

    fuses: bool  # `fused` makes one transaction of many writes (one writer at a time: SQLite)

    def fused(self) -> AbstractContextManager[None]:
        """Every write inside in one transaction, committed at the end or not at all, where the
        backend has one writer at a time anyway (SQLite); a no-op elsewhere. Inside another
        `fused`, all-or-nothing by itself (a savepoint): an error out of it takes back its own
        writes and leaves the outer ones. The caller must not wait inside for another
        process's write to the same store."""
        ...

    def close(self) -> None: ...
