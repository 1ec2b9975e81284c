"""Creating records on Aerospike: a block's transactions, external and multi-record ones, and
a UTXO snapshot's.

Invariants:
- Create-only: a txid already stored (or repeated within the batch) is TxExists and changes
  nothing. Each transaction's record is one create-only write, so each creation is atomic by
  itself; results are per transaction. External ones are written after their blobs (a record
  never names a missing blob); multi-record ones go through the two-phase coordinator.
- What a new record holds is the kernel's (`kernel.create`); a transaction without outputs is
  refused; a one-record transaction keeps its bytes in the record (`raw`).
- A transaction created conflicting is listed on each of its parents' (masters')
  `conflictingCs` right after its own record is written.
- Every new master draws its `rid` (`AerospikeBase._reserve_ids`) just before it is written;
  its pages carry the same.
- A snapshot import is checked whole before anything is written (no txid of it may exist);
  a failure while writing deletes what it wrote, so a failed import leaves the store as it was.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from chain import Tx, hash_to_hex
from stores.errors import StoreError
from stores.utxo import twophase, validate
from stores.utxo.aerospike import codec
from stores.utxo.aerospike.paged import PagedMixin
from stores.utxo.createplan import CreatePlanMixin
from stores.utxo.errors import ProcessingError, TxExists
from stores.utxo.gcpause import gc_paused
from stores.utxo.kernel.record import Record
from stores.utxo.snapshot import snapshot_record
from stores.utxo.values import BlockInfo, TxMeta, Utxo

NO_HASH = b"\x00" * 32


class CreateMixin(PagedMixin, CreatePlanMixin):
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
        """Create each tx (create-only): per tx, its record as created (None with `meta` off),
        or its error."""
        def external_if(tx: Tx) -> bool:
            n_out = len(tx.outputs)
            return (
                self.externalize_all
                or len(tx.raw) > self.max_tx_size_in_store
                or n_out > self.batch_size
                or len(tx.raw) + n_out * 68 > codec.RECORD_BUDGET  # (too large a record)
            )

        plan = self._plan_creates(
            txs, block_height, mined_block_infos, locked=locked, conflicting=conflicting, frozen=frozen,
            external_if=external_if,
        )
        self._write_new(txs, plan.single, plan.results, conflicting)
        if plan.external:
            self._create_external(
                txs, plan.external, plan.fees, plan.results, block_height, mined_block_infos,
                locked=locked, conflicting=conflicting, frozen=frozen,
            )
        return self._created(txs, plan.results, meta)

    def _write_new(
        self,
        txs: Sequence[Tx],
        which: list[int],
        results: list[TxMeta | Record | StoreError | None],
        conflicting: bool,
        raw: bool = True,
    ) -> None:
        """Write the records in `results[which]` create-only (the transaction's bytes with them
        when `raw`); one that exists becomes TxExists."""
        items = []
        for i, rid in zip(which, self._reserve_ids(len(which))):
            rec = results[i]
            assert isinstance(rec, Record)
            rec.id = rid
            bins = codec.to_bins(rec, codec.RAW_TX, txs[i].raw) if raw else codec.to_bins(rec)
            items.append((self.key(rec.txid), bins))
        made = self._create_only(items)
        for i, ok in zip(which, made):
            if not ok:
                results[i] = TxExists(f"tx {hash_to_hex(txs[i].txid)} already exists", txid=txs[i].txid)
        if conflicting:
            self._list_on_parents([txs[i] for i, ok in zip(which, made) if ok])

    def _list_on_parents(self, txs: Sequence[Tx]) -> None:
        """List each (conflicting) tx on its parents' `conflictingCs`."""
        calls = [
            (self.key(i.prev_txid), "add_child", ["conflicting", tx.txid])
            for tx in txs
            for i in tx.inputs
            if i.prev_txid != NO_HASH
        ]
        self._apply_each(calls)

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
        coordinator, one at a time; the one-record ones with their blobs written first."""
        extended = self._extend([txs[i] for i in which], txs)
        todo: list[int] = []
        for i in which:
            tx = extended.get(txs[i].txid, txs[i])
            try:
                if len(tx.outputs) > self.batch_size:
                    flags = {"locked": locked, "conflicting": conflicting, "frozen": frozen}
                    results[i] = twophase.create_paged(self, tx, block_height, blocks, fee=fees[i], **flags)
                    if conflicting:
                        self._list_on_parents([tx])
                    continue
                self.external.put_tx(tx)
            except StoreError as e:
                results[i] = e
                continue
            results[i] = twophase.master_record(
                self,
                tx,
                block_height,
                blocks,
                locked=locked,
                conflicting=conflicting,
                frozen=frozen,
                fee=fees[i],
            )
            todo.append(i)
        self._write_new(txs, todo, results, conflicting, raw=False)

    def begin_paged(self, tx: Tx, block_height: int, batch: Sequence[Tx] = ()) -> twophase.Creation:
        return twophase.begin_paged(self, tx, block_height, batch)

    # -- snapshots --------------------------------------------------------------------------------
    def import_utxos(
        self,
        utxos: Iterable[Utxo],
        block_id: int = 0,
        *,
        height: int | None = None,
        block_hash: bytes | None = None,
    ) -> int:
        """Seed records from a UTXO snapshot (see `stores.utxo.sql.snapshot` for the contract):
        each txid's entries must come together; one already stored or listed twice is TxExists,
        and nothing is imported then."""
        if height is not None:
            validate.height("height", height, zero_ok=False)
        if block_hash is not None:
            validate.hash32("block_hash", block_hash)
        now = int(time.time() * 1000)
        height_now = self.height_for(height or 0)
        done = [0, 0]
        recs: list[tuple[Record, bytes | None]] = []
        group: list[Utxo] = []
        for u in utxos:
            if group and u.txid != group[0].txid:
                recs.append(snapshot_record(self, group, block_id, now, height_now, done))
                group = []
            group.append(u)
        if group:
            recs.append(snapshot_record(self, group, block_id, now, height_now, done))
        if not recs:
            raise ProcessingError("the snapshot has no entries")
        txids = [r.txid for r, _o in recs]
        if len(set(txids)) != len(txids):
            t = next(t for t in txids if txids.count(t) > 1)
            raise TxExists(f"snapshot lists tx {hash_to_hex(t)} in two places", txid=t)
        there = [t for t, e in zip(txids, self._exists([self.key(t) for t in txids])) if e]
        if there:
            raise TxExists(f"snapshot tx {hash_to_hex(there[0])} already exists", txid=there[0])
        items = []
        for (rec, outputs), rid in zip(recs, self._reserve_ids(len(recs))):
            rec.id = rid
            bins = codec.to_bins(rec) if outputs is None else codec.to_bins(rec, codec.RAW_OUTPUTS, outputs)
            items.append((self.key(rec.txid), bins))
            items += [(self.key(rec.txid, k), codec.page_bins(pg, rec)) for k, pg in rec.pages.items()]
        try:
            made = self._create_only(items)
        except BaseException:
            self._remove([key for key, _b in items])  # none of these existed a moment ago
            raise
        if not all(made):  # a concurrent creator came first: take back what this import wrote
            self._remove([key for (key, _b), ok in zip(items, made) if ok])
            t = bytes(items[made.index(False)][0][2][:32])
            raise TxExists(f"snapshot tx {hash_to_hex(t)} already exists", txid=t)
        if height is not None:
            self.set_block_height(height)
        if block_hash is not None:
            self._set_meta(snapshot=f"{height}:{hash_to_hex(block_hash)}")
        return done[0]

    def is_empty(self) -> bool:
        """True when the store holds no record at all."""
        from aerospike_helpers import expressions as exp

        q = self.conn.client.query(self.conn.namespace, self.conn.set)
        q.select("page")
        q.max_records = 1
        found: list[object] = []
        try:
            q.foreach(found.append, {"expressions": exp.BinExists("page").compile()})
        except Exception as e:  # the client's own errors
            raise self._fail("is_empty", e) from e
        return not found
