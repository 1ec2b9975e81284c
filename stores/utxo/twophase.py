"""Two-phase creation of a transaction that spans several records (Teranode's lock-record pattern),
written once for every backend: it drives a store through the record-level calls of `PagedRecords`.

    1. lock    take the creation lock for the txid (create-only, TTL 30 s + 2 s per record,
               at most 300 s); a live lock held by another creator → TxExists
    2. blob    write the transaction to the blob store (already there is fine)
    3. pages   create the master, then every child, each with `creating` set and create-only;
               a page that exists already is a previous attempt's, kept as it is. Pages may be
               written by several workers at once (`write_pages` over disjoint groups).
    4. unlock  release the lock, always, even after a failure: partial pages stay for the next
               attempt
    5. commit  clear `creating` on the children, then on the master. A failure here still
               reports success: the records are all there, and recovery clears the flags.

Invariants:
- While the master has `creating`, no output of the transaction can be spent (the store's
  spend checks the master first), so a half-made transaction is never half-spendable.
- The master's flag is cleared only once every page exists and every child's flag is clear,
  so "master clear" means "complete"; each page's content is a function of the transaction
  and of the creation's `frozen` option (kept beside a creating master, and in the lock row
  before the master exists), so whoever writes a missing page writes the same bytes.
- Recovery (`complete_creation`) needs no lock: it writes only missing pages, create-only, and
  clears flags in the same order, so it is safe beside a live creator. It runs on a retried
  create, on set-mined, and when a reader asks for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chain import Tx, hash_to_hex
from stores.blob.protocol import BlobNotFound
from stores.errors import StorageError, StoreError
from stores.utxo import validate
from stores.utxo.errors import ProcessingError, TxExists
from stores.utxo.external import ExternalTxs
from stores.utxo.kernel import create
from stores.utxo.kernel.record import Record, meta_of
from stores.utxo.values import BlockInfo, CreationLock, TxMeta

log = logging.getLogger("utxoflow.twophase")


class PagedRecords(Protocol):
    """The record-level calls a backend gives the coordinator."""

    batch_size: int
    retention: int
    external: ExternalTxs

    def height_for(self, hint: int = 0) -> int:
        """The height a rule counts from: `hint` or the store's, whichever is higher."""

    def acquire_creation_lock(
        self, txid: bytes, expected_recs: int, options: dict[str, Any] | None = None
    ) -> CreationLock | None: ...
    def creation_options(self, txid: bytes) -> dict[str, Any] | None: ...
    def release_creation_lock(self, lock: CreationLock) -> bool: ...
    def creation_state(self, txid: bytes) -> CreationState | None: ...
    def create_master(
        self, rec: Record, creating: bool = True, options: dict[str, Any] | None = None
    ) -> bool: ...
    def create_page(self, page: Record) -> bool: ...
    def clear_creating_children(self, txid: bytes) -> int: ...
    def clear_creating_master(self, txid: bytes) -> bool: ...


@dataclass(frozen=True, slots=True)
class Creation:
    """A begun creation: the lock to release and what the pages are."""

    txid: bytes
    lock: CreationLock
    pages: int
    frozen: bool
    resumed: bool  # the master existed already: this attempt completes an earlier one
    missing: tuple[int, ...]  # the child pages not written yet when this attempt began


@dataclass(frozen=True, slots=True)
class CreationState:
    """Where a multi-record creation stands: the master's flag and which pages exist."""

    creating: bool
    total_extra_recs: int
    pages: frozenset[int]  # existing page indexes, the master (0) included
    frozen: bool  # the creation asked for frozen outputs

    @property
    def missing(self) -> list[int]:
        return [k for k in range(self.total_extra_recs + 1) if k not in self.pages]


def master_record(
    store: PagedRecords,
    tx: Tx,
    block_height: int,
    blocks: Sequence[BlockInfo],
    *,
    locked: bool,
    conflicting: bool,
    frozen: bool,
    fee: int | None,
) -> Record:
    """The master record of an external transaction (`kernel.create.master`)."""
    return create.master(
        tx,
        block_height,
        [(b.block_id, b.block_height, b.subtree_idx) for b in blocks],
        fee,
        batch_size=store.batch_size,
        retention=store.retention,
        dah_height=store.height_for(block_height),
        created_at=int(time.time() * 1000),
        locked=locked,
        conflicting=conflicting,
        frozen=frozen,
        external=True,
    )


def options(rec: Record, block_height: int, frozen: bool) -> dict[str, Any]:
    """How a creation was asked for, as the lock row (and the creating master) keep it: a
    recovery that finds only the blob rebuilds exactly that."""
    return {
        "block_height": block_height,
        "blocks": [list(b) for b in rec.block_list()],
        "locked": rec.locked,
        "conflicting": rec.conflicting,
        "frozen": frozen,
        "fee": rec.fee,
    }


def check_pages_whole(txid: bytes, exist: int, extra: int, still_creating: int) -> None:
    """The rule for clearing a master's `creating` (both backends' `clear_creating_master`):
    all `extra` child pages exist and none is still creating; else ProcessingError says what
    is missing (the caller clears nothing)."""
    if exist != extra or still_creating:
        raise ProcessingError(
            f"tx {hash_to_hex(txid)}: {exist} of {extra} child pages exist, {still_creating} still creating",
            txid=txid,
        )


def begin_creation(
    store: PagedRecords, tx: Tx, rec: Record, frozen: bool, block_height: int | None = None
) -> Creation:
    """Steps 1–3 for the master: lock, blob, master page. Children follow with `write_pages`;
    then `end_creation`. Raises TxExists when another creator holds the lock or the
    transaction is complete already; on any other failure the lock is released."""
    txid = tx.txid
    pages = rec.total_extra_recs + 1
    opts = options(rec, store.height_for() if block_height is None else block_height, frozen)
    lock = store.acquire_creation_lock(txid, pages, opts)
    if lock is None:
        raise TxExists(f"tx {hash_to_hex(txid)} is being created by another worker", txid=txid)
    try:
        state = store.creation_state(txid)
        if state is not None and not state.creating:
            raise TxExists(f"tx {hash_to_hex(txid)} already exists", txid=txid)
        store.external.put_tx(tx)
        if state is None or 0 not in state.pages:
            store.create_master(rec, options=opts)
    except BaseException:
        _release_quietly(store, lock)
        raise
    if state is None:
        return Creation(txid, lock, pages, frozen, False, tuple(range(1, pages)))
    return Creation(txid, lock, pages, state.frozen, True, tuple(k for k in state.missing if k))


def _release_quietly(store: PagedRecords, lock: CreationLock) -> None:
    try:
        store.release_creation_lock(lock)
    except StoreError as e:  # it lapses by itself; the caller's own error matters more
        log.warning("could not release the creation lock of tx %s: %s", hash_to_hex(lock.txid), e)


def write_pages(store: PagedRecords, tx: Tx, indexes: Iterable[int], frozen: bool) -> int:
    """Create these child pages (create-only; an existing one is kept). Any worker may run this
    for its own group of pages. Returns how many this call created."""
    made = 0
    for k in indexes:
        if k <= 0:
            continue  # the master is written by begin_creation
        made += store.create_page(create.page(tx, k, store.batch_size, frozen))
    return made


def end_creation(store: PagedRecords, creation: Creation) -> bool:
    """Steps 4–5: release the lock, then clear the flags. True when the transaction is now
    complete; False when phase 2 failed (recovery finishes it; this is logged, not raised)."""
    store.release_creation_lock(creation.lock)
    return commit(store, creation.txid)


def commit(store: PagedRecords, txid: bytes) -> bool:
    """Phase 2: children first, then the master (which checks that every page exists)."""
    try:
        store.clear_creating_children(txid)
        return store.clear_creating_master(txid)
    except StoreError as e:
        log.warning("tx %s created but its creating flag is not cleared yet: %s", hash_to_hex(txid), e)
        return False


def create_paged(
    store: PagedRecords,
    tx: Tx,
    block_height: int,
    blocks: Sequence[BlockInfo] = (),
    *,
    locked: bool = False,
    conflicting: bool = False,
    frozen: bool = False,
    fee: int | None = None,
) -> TxMeta:
    """The whole protocol in this process. A retry of a creation that died part-way completes
    it and then reports TxExists, as a duplicate create does."""
    rec = master_record(
        store, tx, block_height, blocks, locked=locked, conflicting=conflicting, frozen=frozen, fee=fee
    )
    creation = begin_creation(store, tx, rec, frozen, block_height)
    try:
        write_pages(store, tx, creation.missing, creation.frozen)
    except BaseException:
        _release_quietly(store, creation.lock)  # the page's error is the one to report
        raise
    done = end_creation(store, creation)
    if creation.resumed:
        raise TxExists(
            f"tx {hash_to_hex(tx.txid)} already existed (an earlier creation was completed)", txid=tx.txid
        )
    return meta_of(rec, tx)._replace(creating=not done)


def complete_creation(store: PagedRecords, txid: bytes, block_height: int | None = None) -> bool:
    """Finish whatever creation of `txid` was left half done: write its missing pages from the
    blob (the master too, when only the blob was written), then clear the flags. Returns True
    when the transaction is complete; False when there is nothing to finish it from (no record
    and no transaction blob) or phase 2 failed again (logged). Safe beside a live creator (see
    the module's invariants)."""
    state = store.creation_state(txid)
    if state is not None and not state.creating:
        return True
    try:
        tx = store.external.get_tx(txid)
    except BlobNotFound:
        if state is None:
            return False
        raise StorageError(f"tx {hash_to_hex(txid)} is half created and its blob is missing") from None
    if tx is None:
        if state is None:
            return False  # an outputs-only blob (a snapshot's): no transaction to rebuild from
        raise StorageError(f"tx {hash_to_hex(txid)}: the blob keeps only outputs; it cannot be rebuilt")
    frozen = False if state is None else state.frozen
    if state is None:
        # Only the blob was written: rebuild the master as its creator asked (the options its
        # lock row keeps). With no lock row left, the creator's call failed and was reported;
        # the transaction is then rebuilt as a plain one, as a block that mines it has it.
        opts = store.creation_options(txid) or {}
        frozen = bool(opts.get("frozen", False))
        height = int(opts.get("block_height", block_height or store.height_for()))
        rec = master_record(
            store,
            tx,
            height,
            [BlockInfo(*b) for b in opts.get("blocks", [])],
            locked=bool(opts.get("locked", False)),
            conflicting=bool(opts.get("conflicting", False)),
            frozen=frozen,
            fee=opts.get("fee", tx.fee()),
        )
        store.create_master(rec, options=options(rec, height, frozen))
        state = store.creation_state(txid)
        if state is None:
            raise StorageError(f"tx {hash_to_hex(txid)}: its master record vanished during recovery")
    write_pages(store, tx, state.missing, frozen)
    log.info("recovered the creation of tx %s (%d missing pages)", hash_to_hex(txid), len(state.missing))
    return commit(store, txid)


def begin_paged(store: Any, tx: Tx, block_height: int, batch: Sequence[Tx] = ()) -> Creation:
    """`UtxoStore.begin_paged` for any store that mixes in `stores.utxo.prevouts` (its `_extend`
    and `_fees`): the master record as a block's creation makes it, then `begin_creation`."""
    validate.height("block_height", block_height)
    refused = create.refusal(tx)
    if refused is not None:
        raise refused
    tx = store._extend([tx], batch).get(tx.txid, tx)
    rec = master_record(
        store, tx, block_height, (), locked=False, conflicting=False, frozen=False, fee=store._fees([tx])[0]
    )
    return begin_creation(store, tx, rec, False, block_height)

