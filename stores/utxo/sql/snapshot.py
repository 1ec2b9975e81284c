"""Seeding a store from a UTXO snapshot (`utxo import-utxos`): records without transactions.

Invariants:
- All or nothing: every record, the store's height and the snapshot's block are written in one
  database transaction, so the store is never seen holding the snapshot at another height.
- A snapshot record holds only the listed outputs (`kernel.create.snapshot`), and their values
  and scripts: in the record (`raw_format` 2), or as an `.outputs` blob when too large.
- The input is streamed, never held whole: each txid's entries must come together.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from chain import hash_to_hex
from stores.utxo import validate
from stores.utxo.errors import ProcessingError, TxExists
from stores.utxo.kernel.record import Record
from stores.utxo.snapshot import snapshot_record
from stores.utxo.sql import codec
from stores.utxo.sql.create import CreateMixin
from stores.utxo.values import Utxo

Snapshot = tuple[Record, int, bytes | None]  # (record, raw_format, raw)


class SnapshotMixin(CreateMixin):
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

        `utxos` may be any iterable but must list each txid's outputs together. A txid already
        stored, or listed again later, is TxExists; entries of one txid that disagree on height
        or coinbase, or no entries at all, are a ProcessingError; nothing is then imported.
        With `height` (and `block_hash`, the block the snapshot was taken at), the same
        transaction sets the store's height and records the block. Returns the UTXO slots
        written."""
        if height is not None:
            validate.height("height", height, zero_ok=False)
        if block_hash is not None:
            validate.hash32("block_hash", block_hash)
        now = int(time.time() * 1000)
        height_now = self.height_for(height or 0)
        done: list[int] = [0, 0]  # slots written, records written

        def records() -> Iterator[Snapshot]:
            group: list[Utxo] = []
            for u in utxos:
                if group and u.txid != group[0].txid:
                    yield self._snapshot_record(group, block_id, now, height_now, done)
                    group = []
                group.append(u)
            if group:
                yield self._snapshot_record(group, block_id, now, height_now, done)

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

        written = self.db.write("import_utxos", unit, retry=False)  # it consumes a stream: once
        if height is not None:
            self.block_height = max(self.block_height, height)
        return written

    def _insert_snapshot(self, cur: Any, recs: list[Snapshot]) -> None:
        if not recs:
            return
        txids = [r[0].txid for r in recs]
        if len(set(txids)) != len(txids):
            t = next(t for t in txids if txids.count(t) > 1)
            raise TxExists(f"snapshot lists tx {hash_to_hex(t)} in two places", txid=t)
        found = self.db.select_in(cur, "SELECT txid FROM txs WHERE txid", txids)
        if found:
            t = bytes(found[0][0])
            raise TxExists(f"snapshot tx {hash_to_hex(t)} already exists", txid=t)
        rows = [codec.values(rec, fmt, raw) for rec, fmt, raw in recs]
        for i, row, (rec, _f, _r) in zip(self._reserve_ids(cur, len(rows)), rows, recs):
            row[0] = rec.id = i
        cur.executemany(self.db.q(codec.INSERT_TX), rows)
        pages = [codec.page_values(pg) for rec, _f, _r in recs for pg in rec.pages.values()]
        if pages:
            cur.executemany(self.db.q(codec.INSERT_PAGE), pages)
        # after the pages: a mark moved on here reads the pages of the records it passes
        self._index_new(cur, [rec for rec, _f, _r in recs])

    def _snapshot_record(
        self, us: list[Utxo], block_id: int, now: int, height: int, done: list[int]
    ) -> Snapshot:
        rec, outputs = snapshot_record(self, us, block_id, now, height, done)
        return rec, codec.RAW_NONE if outputs is None else codec.RAW_OUTPUTS, outputs

    def is_empty(self) -> bool:
        """True when the store holds no record at all."""
        return self.db.read(
            "is_empty", lambda cur: cur.execute("SELECT 1 FROM txs LIMIT 1").fetchone() is None
        )
