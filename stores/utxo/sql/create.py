"""Creating records: a block's transactions, and external and multi-record ones.

Invariants:
- Create-only: a txid already stored (or repeated within the batch) is TxExists and changes
  nothing. Each transaction's creation is atomic by itself, and results are per transaction:
  the one-record transactions of a batch are written in one database transaction, external
  ones after their blobs (blob first, so a record never names a missing blob), and
  multi-record ones through the two-phase coordinator (`stores.utxo.twophase`).
- What a new record holds is the kernel's (`kernel.create`); a transaction without outputs is
  refused.
- A transaction created conflicting is listed on each of its parents' `conflicting_children`
  in the unit that inserts it (a multi-record one right after its pages are committed).
- The fee comes from the inputs' previous outputs: carried by an extended transaction, else read
  from the batch itself or the store; when a previous output is unknown the fee is None.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from chain import Tx, hash_to_hex
from stores.errors import StoreError
from stores.utxo import twophase
from stores.utxo.createplan import CreatePlanMixin
from stores.utxo.errors import ProcessingError, TxExists
from stores.utxo.gcpause import gc_paused
from stores.utxo.kernel import marks
from stores.utxo.kernel.record import Record
from stores.utxo.sql import codec
from stores.utxo.sql.spend import SpendMixin
from stores.utxo.values import BlockInfo, TxMeta

log = logging.getLogger("utxoflow.store")
NO_HASH = b"\x00" * 32
Row = tuple[int, bytes, list[Any]]  # (index in the call, txid, the INSERT's values)
Copy = tuple[str, tuple[Any, ...]]  # (COPY statement, values appended to every row)


class _Raced(Exception):
    """Another writer inserted one of our txids between our check and our insert."""


class CreateMixin(SpendMixin, CreatePlanMixin):
    @gc_paused
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
        """Create each tx (create-only): per tx, its record as created (`meta` off: None, which
        spares a block's worth of TxMeta a caller that only wants the errors), or its error."""
        batch_size, max_size, ext_all = self.batch_size, self.max_tx_size_in_store, self.externalize_all
        plan = self._plan_creates(
            txs, block_height, mined_block_infos, locked=locked, conflicting=conflicting, frozen=frozen,
            external_if=lambda tx: ext_all or len(tx.raw) > max_size or len(tx.outputs) > batch_size,
        )
        results, fees, external = plan.results, plan.fees, plan.external
        todo: list[Row] = []
        insert = None
        for i in plan.single:
            rec = results[i]
            assert isinstance(rec, Record)
            if insert is None:
                insert = codec.create_insert(rec, self.db.empty_blob)
            todo.append((i, rec.txid, codec.create_values(rec, txs[i].raw)))
        after = self._list_on_parents(txs) if conflicting else None
        dups: list[int] = []
        if insert is not None:
            copy = (codec.COPY_CREATE, codec.create_shared(results[todo[0][0]]))  # type: ignore[arg-type]
            dups = self._insert_new("create", todo, insert, after, copy, results)
        if external:
            self._create_external(
                txs,
                external,
                fees,
                results,
                block_height,
                mined_block_infos,
                locked=locked,
                conflicting=conflicting,
                frozen=frozen,
            )
        for i in dups:
            txid = txs[i].txid
            results[i] = TxExists(f"tx {hash_to_hex(txid)} already exists", txid=txid)
        return self._created(txs, results, meta)

    def _list_on_parents(self, txs: Sequence[Tx]) -> Callable[[Any, set[bytes]], None]:
        """For a conflicting creation: list each inserted tx on its parents (in the insert's unit)."""
        by_id = {t.txid: t for t in txs}

        def after(cur: Any, inserted: set[bytes]) -> None:
            parents = {i.prev_txid for t in inserted for i in by_id[t].inputs} - {NO_HASH}
            recs = self._records(cur, parents)
            for t in sorted(inserted):
                for i in by_id[t].inputs:
                    if i.prev_txid in recs:
                        marks.add_conflicting_child(recs[i.prev_txid], t)
            self._write(cur, recs.values())

        return after

    def _list_paged_on_parents(self, tx: Tx) -> None:
        """A multi-record tx created conflicting, listed on its parents (after its pages)."""
        listed = self._list_on_parents([tx])
        self.db.write("create", lambda cur: listed(cur, {tx.txid}))

    def _create_external(
        self,
        txs: Sequence[Tx],
        which: list[int],
        fees: list[int | None],
        results: list[TxMeta | Record | StoreError | None],
        block_height: int,
        blocks: Sequence[BlockInfo],
        *,
        locked: bool,
        conflicting: bool,
        frozen: bool,
    ) -> None:
        """External transactions: those spanning several records through the two-phase
        coordinator, one at a time; the one-record ones with their blobs written first, then
        their records inserted together."""
        extended = self._extend([txs[i] for i in which], txs)
        todo: list[Row] = []
        for i in which:
            tx = extended.get(txs[i].txid, txs[i])
            try:
                if len(tx.outputs) > self.batch_size:
                    results[i] = twophase.create_paged(
                        self,
                        tx,
                        block_height,
                        blocks,
                        locked=locked,
                        conflicting=conflicting,
                        frozen=frozen,
                        fee=fees[i],
                    )
                    if conflicting:
                        self._list_paged_on_parents(tx)
                    continue
                self.external.put_tx(tx)
            except StoreError as e:
                results[i] = e
                continue
            rec = twophase.master_record(
                self,
                tx,
                block_height,
                blocks,
                locked=locked,
                conflicting=conflicting,
                frozen=frozen,
                fee=fees[i],
            )
            todo.append((i, tx.txid, codec.values(rec)))
            results[i] = rec
        if todo:
            after = self._list_on_parents(txs) if conflicting else None
            for i in self._insert_new("create", todo, codec.INSERT_TX, after, (codec.COPY_TX, ()), results):
                results[i] = TxExists(f"tx {hash_to_hex(txs[i].txid)} already exists", txid=txs[i].txid)

    def begin_paged(self, tx: Tx, block_height: int, batch: Sequence[Tx] = ()) -> twophase.Creation:
        return twophase.begin_paged(self, tx, block_height, batch)

    def _insert_new(
        self,
        what: str,
        todo: list[Row],
        insert: str,
        after: Callable[[Any, set[bytes]], None] | None = None,
        copy: Copy | None = None,
        records: Sequence[Any] = (),
    ) -> list[int]:
        """Insert the rows whose txid is not stored yet (`after(cursor, inserted txids)` runs in
        the same unit); return the indexes of those that were. Each row's first value is its
        id, set here. `copy`: the same rows as a COPY statement and the values `insert` holds
        as literals, for a backend that copies (`_insert_rows`). `records[i]`: the `Record` of
        row i (by its index in the call), whose script index entries the unit writes too."""
        ordered = sorted(todo, key=lambda t: t[1])  # one insertion order for every writer: no deadlocks
        sql = self.db.q(insert)

        def write(cur: Any, rows: list[Row]) -> None:
            for i, row in zip(self._reserve_ids(cur, len(rows)), rows):
                row[2][0] = i
            if self._insert_rows(cur, sql, copy, [row[2] for row in rows]) != len(rows):
                raise _Raced()
            if records:
                made = []
                for i, _t, values in rows:
                    rec = records[i]
                    rec.id = values[0]
                    made.append(rec)
                self._index_new(cur, made)
            if after is not None:
                after(cur, {row[1] for row in rows})

        def optimistic(cur: Any) -> list[int]:
            # The common case: nothing exists yet. ON CONFLICT DO NOTHING makes a clash show as a
            # short row count; then this unit rolls back and `checked` sorts out which existed.
            write(cur, ordered)
            return []

        def checked(cur: Any) -> list[int]:
            existing = {
                bytes(r[0])
                for r in self.db.select_in(cur, "SELECT txid FROM txs WHERE txid", [t[1] for t in ordered])
            }
            new = [t for t in ordered if t[1] not in existing]
            if new:
                write(cur, new)
            return [t[0] for t in todo if t[1] in existing]

        try:
            return self.db.write(what, optimistic)
        except _Raced:
            pass
        for _attempt in range(self.db.max_retries):
            try:
                return self.db.write(what, checked)
            except _Raced:
                continue
        raise ProcessingError(f"{what} kept racing with concurrent creators of the same txids")

    def _insert_rows(self, cur: Any, insert: str, copy: Copy | None, rows: list[list[Any]]) -> int:
        """Run `insert` (INSERT … ON CONFLICT DO NOTHING) for `rows`: how many went in (fewer
        than the rows: a txid was there already)."""
        cur.executemany(insert, rows)
        return int(cur.rowcount)
