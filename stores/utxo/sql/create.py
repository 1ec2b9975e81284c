"""Creating records: transactions and snapshot imports.

Invariants:
- Create-only: a txid already stored (or repeated within the batch) is TxExists and changes
  nothing. Each transaction's creation is atomic by itself, and results are per transaction:
  the one-record transactions of a batch are written in one database transaction, external
  ones after their blobs (blob first, so a record never names a missing blob), and
  multi-record ones through the two-phase coordinator (`stores.utxo.twophase`).
- A transaction without outputs is refused; zero-satoshi data carriers get an empty slot (no
  UTXO), and `total_utxos` counts the real slots.
- The fee comes from the inputs' previous outputs: carried by an extended transaction, else read
  from the batch itself or the store; when a previous output is unknown the fee is None.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from chain import Tx, hash_to_hex, is_data_carrier, utxo_hash
from stores.utxo import slots, twophase, validate
from stores.utxo.errors import ProcessingError, StorageError, TxExists, UtxoError
from stores.utxo.gcpause import gc_paused
from stores.utxo.pages import MasterRecord, Page, tx_slots
from stores.utxo.records import BlockInfo, OutputInfo, TxMeta, Utxo
from stores.utxo.rules import COINBASE_MATURITY, next_dah
from stores.utxo.sql.pages import PageMixin, master_row
from stores.utxo.sql.schema import INSERT_TX, TX_COLS

__all__ = ["INSERT_TX", "TX_COLS", "CreateMixin", "ImportMixin", "utxo_slots"]
log = logging.getLogger("utxoflow.store")

RAW_NONE, RAW_TX, RAW_OUTPUTS = 0, 1, 2  # raw_format: none (external), a tx, a snapshot's outputs
# Per-row values of a created transaction; the columns every row of one call shares are
# written as literals (`create_statement`), which halves the parameters bound per row.
CREATE_COLS = (
    "id, txid, version, locktime, fee, size_in_bytes, is_coinbase, spending_height, total_utxos, "
    "delete_at_height, conflicting_children, inpoints, utxos, raw, created_at"
)
CREATE_SHARED = (
    "locked, creating, conflicting, unmined_since, preserve_until, external, "
    "total_extra_recs, spent_utxos, blocks, reassignments, spendable_in, raw_format"
)


def create_statement(locked: bool, conflicting: bool, unmined_since: int | None, blocks: str) -> str:
    """The INSERT of one create call. Every literal is an int or a JSON list of ints (checked
    here), so no quoting issue can arise; a worker sees few distinct texts (one per block for
    mined creations), which the statement caches keep prepared. `created_at` stays a parameter."""
    if not all(c in "0123456789[],-" for c in blocks):
        raise ProcessingError(f"unexpected block list {blocks!r}")
    unmined = "NULL" if unmined_since is None else str(int(unmined_since))
    shared = (
        f"{int(locked)}, 0, {int(conflicting)}, {unmined}, NULL, 0, 0, 0, '{blocks}', "
        f"'[]', '{{}}', {RAW_TX}"
    )
    marks = ", ".join(["?"] * 15)
    return (
        f"INSERT INTO txs ({CREATE_COLS}, {CREATE_SHARED}) VALUES ({marks}, {shared}) "
        "ON CONFLICT (txid) DO NOTHING"
    )


NO_HASH = slots.NO_HASH
_u32 = struct.Struct("<I").pack


class RecentOutputs:
    """The output values of the transactions this process created last, by txid, bounded: a
    block's transactions spend the previous blocks' mostly, and a fee needs its inputs' values.
    A txid names its outputs for good, so an entry is never stale (not even once its record is
    pruned or a refused block's records are deleted: a fee is computed from what the tx spends)."""

    def __init__(self, max_outputs: int = 200_000) -> None:
        self.max_outputs = max_outputs
        self._values: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._count = 0

    def add(self, tx: Tx) -> None:
        if tx.txid in self._values or len(tx.outputs) > self.max_outputs // 4:
            return  # a huge tx would push everything else out
        values = tuple([o.satoshis for o in tx.outputs])
        self._values[tx.txid] = values
        self._count += len(values)
        while self._count > self.max_outputs:
            _t, old = self._values.popitem(last=False)
            self._count -= len(old)

    def get(self, txid: bytes, vout: int) -> int | None:
        values = self._values.get(txid)
        return values[vout] if values is not None and vout < len(values) else None


class _Raced(Exception):
    """Another writer inserted one of our txids between our check and our insert."""


# The slots of a one-record transaction: the builder pages share (an alias for the benchmarks).
utxo_slots = tx_slots


class CreateMixin(PageMixin):
    recent: RecentOutputs  # set by the store: output values of what this process created last

    def create(
        self,
        tx: Tx,
        block_height: int,
        mined_block_infos: Sequence[BlockInfo] = (),
        locked: bool = False,
        conflicting: bool = False,
        frozen: bool = False,
    ) -> TxMeta:
        (r,) = self.create_many([tx], block_height, mined_block_infos, locked, conflicting, frozen)
        if isinstance(r, UtxoError):
            raise r
        return r

    @gc_paused
    def create_many(
        self,
        txs: Sequence[Tx],
        block_height: int,
        mined_block_infos: Sequence[BlockInfo] = (),
        locked: bool = False,
        conflicting: bool = False,
        frozen: bool = False,
    ) -> list[TxMeta | UtxoError]:
        validate.height("block_height", block_height)
        for b in mined_block_infos:
            validate.number("block_id", b.block_id)
            validate.height("block height", b.block_height)
            validate.number("subtree_idx", b.subtree_idx)
        results: list[TxMeta | UtxoError | None] = [None] * len(txs)
        fees = self._fees(txs)
        height = self._height(block_height)
        now = int(time.time() * 1000)
        blocks = [[b.block_id, b.block_height, b.subtree_idx] for b in mined_block_infos]
        blocks_json = json.dumps(blocks, separators=(",", ":"))
        block_ids = tuple(b[0] for b in blocks)  # tuples: shared by every record of the call
        block_heights = tuple(b[1] for b in blocks)
        subtree_idxs = tuple(b[2] for b in blocks)
        unmined_since = None if blocks else block_height
        # A new record has nothing spent, so its DAH depends only on whether it has any UTXO:
        # ask the rule once for each case instead of once per transaction.
        dah_for = {
            has: next_dah(
                current=None, conflicting=conflicting, locked=locked, preserve_until=None, spent=0,
                utxos=int(has), mined_on_longest=bool(blocks), height=height, retention=self.retention,
            )
            for has in (False, True)
        }
        insert = create_statement(locked, conflicting, unmined_since, blocks_json)
        seen: set[bytes] = set()
        new = tuple.__new__
        todo: list[tuple[int, bytes, list[Any]]] = []
        external: list[int] = []
        batch_size, max_size, ext_all = self.batch_size, self.max_tx_size_in_store, self.externalize_all
        for i, tx in enumerate(txs):
            txid = tx.txid
            if not tx.outputs:
                results[i] = ProcessingError(f"tx {tx.txid_hex} has no outputs", txid=txid)
                continue
            if txid in seen:
                results[i] = TxExists(f"tx {tx.txid_hex} appears twice in the batch", txid=txid)
                continue
            seen.add(txid)
            if ext_all or len(tx.raw) > max_size or len(tx.outputs) > batch_size:
                external.append(i)
                continue
            packed, n_utxos = tx_slots(tx, frozen=frozen)
            ins = tx.inputs
            coinbase = len(ins) == 1 and ins[0].prev_vout == 0xFFFFFFFF and ins[0].prev_txid == NO_HASH
            inpoints = [] if coinbase else [(i.prev_txid, i.prev_vout) for i in ins]
            spending_height = block_height + COINBASE_MATURITY if coinbase else 0
            dah = dah_for[n_utxos > 0]
            raw = tx.raw
            # A list, so that `_insert_new` can fill in the id (first) without copying the row.
            todo.append((i, txid, [
                0, txid, tx.version, tx.locktime, fees[i], len(raw), int(coinbase), spending_height,
                n_utxos, dah, b"", b"".join([t + _u32(v) for t, v in inpoints]), packed, raw, now,
            ]))
            # tuple.__new__ skips NamedTuple's keyword handling: a block makes thousands of these.
            results[i] = new(TxMeta, (
                txid, fees[i], len(raw), coinbase, tx.version, tx.locktime, inpoints, locked,
                False, conflicting, (), unmined_since, now, None, dah, spending_height,
                block_ids, block_heights, subtree_idxs, False, 0, n_utxos, 0, (), tx,
            ))

        dups = self._insert_new("create", todo, insert) if todo else []
        if external:
            self._create_external(
                txs, external, fees, results, block_height, mined_block_infos,
                locked=locked, conflicting=conflicting, frozen=frozen,
            )
        for i in dups:
            txid = txs[i].txid
            results[i] = TxExists(f"tx {hash_to_hex(txid)} already exists", txid=txid)
        recent = self.recent
        for tx, r in zip(txs, results):
            if isinstance(r, TxMeta):
                recent.add(tx)
        return results  # type: ignore[return-value]

    def _create_external(
        self,
        txs: Sequence[Tx],
        which: list[int],
        fees: list[int | None],
        results: list[TxMeta | UtxoError | None],
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
        todo: list[tuple[int, bytes, list[Any]]] = []
        recs: dict[int, MasterRecord] = {}
        for i in which:
            tx = extended.get(txs[i].txid, txs[i])
            try:
                if len(tx.outputs) > self.batch_size:
                    results[i] = twophase.create_paged(
                        self, tx, block_height, blocks, locked=locked, conflicting=conflicting,  # type: ignore[arg-type]
                        frozen=frozen, fee=fees[i],
                    )
                    continue
                self.external.put_tx(tx)
            except UtxoError as e:
                results[i] = e
                continue
            rec = recs[i] = twophase.master_record(
                self, tx, block_height, blocks, locked=locked, conflicting=conflicting,  # type: ignore[arg-type]
                frozen=frozen, fee=fees[i],
            )
            todo.append((i, tx.txid, master_row(rec, creating=False)))
            results[i] = twophase.meta_of(rec, tx, creating=False)
        if todo:
            for i in self._insert_new("create", todo, self._q(INSERT_TX)):
                results[i] = TxExists(f"tx {hash_to_hex(txs[i].txid)} already exists", txid=txs[i].txid)

    def begin_paged(self, tx: Tx, block_height: int, batch: Sequence[Tx] = ()) -> twophase.Creation:
        validate.height("block_height", block_height)
        if not tx.outputs:
            raise ProcessingError(f"tx {tx.txid_hex} has no outputs", txid=tx.txid)
        tx = self._extend([tx], batch).get(tx.txid, tx)
        rec = twophase.master_record(
            self, tx, block_height, (), locked=False, conflicting=False, frozen=False,  # type: ignore[arg-type]
            fee=self._fees([tx])[0],
        )
        return twophase.begin_creation(self, tx, rec, False)  # type: ignore[arg-type]

    def _extend(self, wanted: Sequence[Tx], batch: Sequence[Tx]) -> dict[bytes, Tx]:
        """Extended copies of the standard-format transactions among `wanted` whose previous
        outputs are all known (in the batch or the store), so that their blobs need no parent
        lookups later; the others are left out (they are stored as they are)."""
        lacking = [t for t in wanted if not t.is_extended]
        if not lacking:
            return {}
        in_batch = {t.txid: t for t in batch}
        need = sorted({
            (i.prev_txid, i.prev_vout) for t in lacking for i in t.inputs if i.prev_txid not in in_batch
        })
        known = {op: (o.satoshis, o.script) for op, o in self._prevouts(need).items()}
        out: dict[bytes, Tx] = {}
        for t in lacking:
            ins = []
            for i in t.inputs:
                parent = in_batch.get(i.prev_txid)
                if parent is not None and i.prev_vout < len(parent.outputs):
                    o = parent.outputs[i.prev_vout]
                    prev: tuple[int, bytes] | None = (o.satoshis, o.script)
                else:
                    prev = known.get((i.prev_txid, i.prev_vout))
                if prev is None:
                    break
                ins.append(dataclasses.replace(i, prev_satoshis=prev[0], prev_script=prev[1]))
            else:
                out[t.txid] = dataclasses.replace(t, inputs=ins)
        return out

    def _insert_new(
        self, what: str, todo: list[tuple[int, bytes, list[Any]]], insert: str
    ) -> list[int]:
        """Insert the rows whose txid is not stored yet; return the indexes of those that were.
        Each row's first value is its id, set here."""

        ordered = sorted(todo, key=lambda t: t[1])  # one insertion order for every writer: no deadlocks

        def optimistic(cur: Any) -> list[int]:
            # The common case: nothing exists yet. ON CONFLICT DO NOTHING makes a clash show as a
            # short row count; then this unit rolls back and `checked` sorts out which existed.
            if ordered:
                rows = [t[2] for t in ordered]
                for i, row in zip(self._reserve_ids(cur, len(rows)), rows):
                    row[0] = i
                cur.executemany(self._q(insert), rows)
                if cur.rowcount != len(ordered):
                    raise _Raced()
            return []

        def checked(cur: Any) -> list[int]:
            existing: set[bytes] = set()
            for part in self._chunks([t[1] for t in ordered]):
                existing.update(bytes(r[0]) for r in self._select_txs(cur, "txid", part, False))
            new = [t for t in ordered if t[1] not in existing]
            if new:
                rows = [t[2] for t in new]
                for i, row in zip(self._reserve_ids(cur, len(rows)), rows):
                    row[0] = i
                cur.executemany(self._q(insert), rows)
                if cur.rowcount != len(new):
                    raise _Raced()
            return [t[0] for t in todo if t[1] in existing]

        try:
            return self._run_write(what, optimistic)
        except _Raced:
            pass
        for _attempt in range(self.max_retries):
            try:
                return self._run_write(what, checked)
            except _Raced:
                continue
        raise ProcessingError(f"{what} kept racing with concurrent creators of the same txids")

    def _prevouts(self, need: Sequence[tuple[bytes, int]]) -> dict[tuple[bytes, int], OutputInfo]:
        """Previous outputs for fees and extended blobs. They are a convenience: when the blob
        store cannot give an external parent's outputs, those stay unknown (fee None, the blob
        in standard format) rather than failing the creation of a whole block."""
        if not need:
            return {}
        try:
            return self.get_outputs(need)
        except StorageError as e:
            log.warning("previous outputs unavailable, fees left unknown: %s", e)
            return {}

    def _fees(self, txs: Sequence[Tx]) -> list[int | None]:
        """Each tx's fee; previous outputs a non-extended tx lacks come from the batch or store."""
        fees: list[int | None] = []
        lacking: list[int] = []
        for k, tx in enumerate(txs):
            ins = tx.inputs
            if len(ins) == 1 and ins[0].prev_vout == 0xFFFFFFFF and ins[0].prev_txid == NO_HASH:
                fees.append(0)
                continue
            total = 0
            for i in ins:
                if i.prev_satoshis is None:
                    lacking.append(k)
                    total = -1
                    break
                total += i.prev_satoshis
            fees.append(None if total < 0 else total - sum([o.satoshis for o in tx.outputs]))
        if not lacking:
            return fees
        # Standard-format transactions: look their previous outputs up, in the batch first.
        in_batch = {t.txid: t for t in txs}
        need: set[tuple[bytes, int]] = set()
        values: dict[tuple[bytes, int], int] = {}
        for k in lacking:
            for i in txs[k].inputs:
                if i.prev_satoshis is not None:
                    continue
                parent = in_batch.get(i.prev_txid)
                if parent is not None and i.prev_vout < len(parent.outputs):
                    values[(i.prev_txid, i.prev_vout)] = parent.outputs[i.prev_vout].satoshis
                elif (v := self.recent.get(i.prev_txid, i.prev_vout)) is not None:
                    values[(i.prev_txid, i.prev_vout)] = v
                else:
                    need.add((i.prev_txid, i.prev_vout))
        if need:
            for key, info in self._prevouts(sorted(need)).items():
                values[key] = info.satoshis
        for k in lacking:
            tx = txs[k]
            total = 0
            for i in tx.inputs:
                v = i.prev_satoshis if i.prev_satoshis is not None else values.get((i.prev_txid, i.prev_vout))
                if v is None:
                    break
                total += v
            else:
                fees[k] = total - sum([o.satoshis for o in tx.outputs])
        return fees


# A snapshot record: txid, its `INSERT_TX` values without the id, and its child pages.
Snapshot = tuple[bytes, tuple[Any, ...], list[Page]]


class ImportMixin(CreateMixin):
    def import_utxos(
        self,
        utxos: Iterable[Utxo],
        block_id: int = 0,
        *,
        height: int | None = None,
        block_hash: bytes | None = None,
    ) -> int:
        """Seed records from a UTXO snapshot (no raw transactions) in one database transaction:
        one record per txid, mined at its entries' height, holding just the listed outputs.

        `utxos` may be any iterable (it is streamed, never held) but must list each txid's
        outputs together. A txid already stored, or listed again later, is TxExists; entries of
        one txid that disagree on height or coinbase, or no entries at all, are a
        ProcessingError; nothing is then imported. With `height` (and `block_hash`, the block the
        snapshot was taken at), the same transaction sets the store's height and records the
        block, so the store is never seen holding the snapshot at another height.
        Returns the number of UTXO slots written."""
        if height is not None:
            validate.height("height", height, zero_ok=False)
        if block_hash is not None:
            validate.hash32("block_hash", block_hash)
        now = int(time.time() * 1000)
        height_now = max(self._height(), height or 0)
        done: list[int] = [0, 0]  # slots written, records written

        def records() -> Iterator[Snapshot]:
            group: list[Utxo] = []
            for u in utxos:
                if group and u.txid != group[0].txid:
                    yield self._snapshot_row(group, block_id, now, height_now, done)
                    group = []
                group.append(u)
            if group:
                yield self._snapshot_row(group, block_id, now, height_now, done)

        def unit(cur: Any) -> int:
            pending: list[Snapshot] = []
            for rec in records():
                pending.append(rec)
                if len(pending) >= 2000:
                    self._insert_snapshot(cur, pending)
                    pending = []
            self._insert_snapshot(cur, pending)
            if done[1] == 0:
                raise ProcessingError("the snapshot has no entries")
            if height is not None:
                self._set_meta(cur, "block_height", str(height))
            if block_hash is not None:
                self._set_meta(cur, "snapshot_block", f"{height}:{hash_to_hex(block_hash)}")
            return done[0]

        written = self._run_write("import_utxos", unit, retry=False)
        if height is not None:
            self.block_height = max(self.block_height, height)
        return written

    def _insert_snapshot(self, cur: Any, recs: list[Snapshot]) -> None:
        if not recs:
            return
        txids = [r[0] for r in recs]
        if len(set(txids)) != len(txids):
            t = next(t for t in txids if txids.count(t) > 1)
            raise TxExists(f"snapshot lists tx {hash_to_hex(t)} in two places", txid=t)
        for part in self._chunks(txids):
            found = self._select_txs(cur, "txid", part, False)
            if found:
                t = bytes(found[0][0])
                raise TxExists(f"snapshot tx {hash_to_hex(t)} already exists", txid=t)
        ids = self._reserve_ids(cur, len(recs))
        cur.executemany(self._q(INSERT_TX), [(i, *r[1]) for i, r in zip(ids, recs)])
        pages = [pg for r in recs for pg in r[2]]
        if pages:
            cur.executemany(
                self._q(
                    "INSERT INTO tx_pages (txid, page, creating, total_utxos, spent_utxos, utxos) "
                    "VALUES (?, ?, 0, ?, 0, ?)"
                ),
                [(pg.txid, pg.index, pg.n_utxos, pg.utxos) for pg in pages],
            )

    def _snapshot_row(
        self, us: list[Utxo], block_id: int, now: int, height: int, done: list[int]
    ) -> Snapshot:
        """One snapshot record: its `INSERT_TX` values (without the id) and its child pages. A
        record whose outputs reach past the batch size gets pages — only those that hold listed
        outputs; a missing page simply has no UTXO — and outputs too large for a record go to
        the blob store as `.outputs`."""
        txid = us[0].txid
        h, coinbase = us[0].height or 0, us[0].coinbase
        hashes: dict[int, bytes | None] = {}
        for u in us:
            validate.hash32("txid", u.txid)
            validate.number("satoshis", u.satoshis, (1 << 64) - 1)
            if u.height is not None:
                validate.height("height", u.height)
            if (u.height or 0) != h or u.coinbase != coinbase:
                raise ProcessingError(
                    f"snapshot entries of tx {hash_to_hex(txid)} disagree on height or coinbase", txid=txid
                )
            if type(u.vout) is not int or not 0 <= u.vout <= validate.MAX_VOUT:
                raise ProcessingError(
                    f"snapshot output {hash_to_hex(txid)}:{u.vout}: vout out of range "
                    f"(0…{validate.MAX_VOUT})", txid=txid,
                )
            if u.vout in hashes:
                raise ProcessingError(f"snapshot lists output {hash_to_hex(txid)}:{u.vout} twice", txid=txid)
            hashes[u.vout] = (
                None if is_data_carrier(u.satoshis, u.script)
                else utxo_hash(txid, u.vout, u.script, u.satoshis)
            )
        n = sum(x is not None for x in hashes.values())
        done[0] += n
        done[1] += 1
        dah = next_dah(
            current=None, conflicting=False, locked=False, preserve_until=None, spent=0,
            utxos=n, mined_on_longest=True, height=height, retention=self.retention,
        )
        size, top = self.batch_size, max(hashes)
        packed = slots.pack(hashes.get(v) for v in range(min(top + 1, size)))
        by_page: dict[int, list[int]] = {}
        for v in hashes:
            if v >= size:
                by_page.setdefault(v // size, []).append(v)
        pages = []
        for k, vs in sorted(by_page.items()):
            first, last = k * size, max(vs)
            pages.append(Page(
                txid, k, slots.pack(hashes.get(v) for v in range(first, last + 1)),
                sum(hashes[v] is not None for v in vs),
            ))
        items = sorted((u.vout, u.satoshis, u.script) for u in us)
        outputs: bytes | None = slots.encode_outputs(items)
        raw_format, external = RAW_OUTPUTS, 0
        if self.externalize_all or len(outputs) > self.max_tx_size_in_store:  # type: ignore[arg-type]
            self.external.put_outputs(txid, h, coinbase, items)
            outputs, raw_format, external = None, RAW_NONE, 1
        return txid, (
            txid, 0, 0, None, 0, int(coinbase), h + COINBASE_MATURITY if coinbase else 0,
            0, 0, 0, None, now, None, dah, external, top // size, n, 0,
            json.dumps([[block_id, h, 0]], separators=(",", ":")), b"", "[]", "{}", b"",
            packed, raw_format, outputs,
        ), pages

    def is_empty(self) -> bool:
        """True when the store holds no record at all."""
        return self._run_read("is_empty", lambda cur: _first(cur, "SELECT 1 FROM txs LIMIT 1") is None)


def _first(cur: Any, sql: str) -> Any:
    cur.execute(sql)
    return cur.fetchone()
