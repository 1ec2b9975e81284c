"""Creating transaction records (the one-record path).

Invariants:
- Create-only: a txid already stored (or repeated within the batch) is TxExists and changes
  nothing. The tx row and all its output rows are written in the same database transaction.
- A transaction without outputs is refused; zero-satoshi data carriers get no output row.
- The fee comes from the inputs' previous outputs: carried by an extended transaction, else read
  from the batch itself or the store; when a previous output is unknown the fee is None.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from chain import Tx, hash_to_hex, is_data_carrier, utxo_hash
from stores.utxo.errors import ProcessingError, TxExists, UtxoError
from stores.utxo.records import BlockInfo, TxMeta, Utxo
from stores.utxo.rules import COINBASE_MATURITY, next_dah
from stores.utxo.sql.base import SqlBase, chunks

TX_COLS = (
    "txid, version, locktime, fee, size_in_bytes, is_coinbase, spending_height, locked, creating, "
    "conflicting, unmined_since, created_at, preserve_until, delete_at_height, external, "
    "total_extra_recs, total_utxos, spent_utxos, blocks, conflicting_children, reassignments, "
    "inpoints, raw"
)
INSERT_TX = (
    f"INSERT INTO txs ({TX_COLS}) VALUES ({', '.join(['?'] * 23)}) ON CONFLICT (txid) DO NOTHING"
)
INSERT_OUTPUT = (
    "INSERT INTO outputs (txid, vout, utxo_hash, satoshis, script, frozen) VALUES (?, ?, ?, ?, ?, ?)"
)


class _Raced(Exception):
    """Another writer inserted one of our txids between our check and our insert."""


def output_rows(tx: Tx, frozen: int) -> list[tuple[bytes, int, bytes, int, bytes, int]]:
    txid = tx.txid
    return [
        (txid, vout, utxo_hash(txid, vout, o.script, o.satoshis), o.satoshis, o.script, frozen)
        for vout, o in enumerate(tx.outputs)
        if not is_data_carrier(o.satoshis, o.script)
    ]


class CreateMixin(SqlBase):
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

    def create_many(
        self,
        txs: Sequence[Tx],
        block_height: int,
        mined_block_infos: Sequence[BlockInfo] = (),
        locked: bool = False,
        conflicting: bool = False,
        frozen: bool = False,
    ) -> list[TxMeta | UtxoError]:
        results: list[TxMeta | UtxoError] = [None] * len(txs)  # type: ignore[list-item]
        fees = self._fees(txs)
        height = self._height(block_height)
        now = int(time.time() * 1000)
        blocks = [[b.block_id, b.block_height, b.subtree_idx] for b in mined_block_infos]
        blocks_json = json.dumps(blocks, separators=(",", ":"))
        unmined_since = None if blocks else block_height
        seen: set[bytes] = set()
        todo: list[tuple[int, Tx, TxMeta, tuple[Any, ...], list[Any]]] = []
        for i, tx in enumerate(txs):
            if not tx.outputs:
                results[i] = ProcessingError(f"tx {tx.txid_hex} has no outputs", txid=tx.txid)
                continue
            if tx.txid in seen:
                results[i] = TxExists(f"tx {tx.txid_hex} appears twice in the batch", txid=tx.txid)
                continue
            seen.add(tx.txid)
            outs = output_rows(tx, int(frozen))
            coinbase = tx.is_coinbase
            spending_height = block_height + COINBASE_MATURITY if coinbase else 0
            inpoints = tx.inpoints()
            inpoints_blob = b"".join(t + v.to_bytes(4, "little") for t, v in inpoints)
            dah = next_dah(
                current=None, conflicting=conflicting, locked=locked, preserve_until=None, spent=0,
                utxos=len(outs), mined_on_longest=bool(blocks), height=height,
                retention=self.retention,
            )
            row = (
                tx.txid, tx.version, tx.locktime, fees[i], tx.size, int(coinbase), spending_height,
                int(locked), 0, int(conflicting), unmined_since, now, None, dah, 0, 0, len(outs), 0,
                blocks_json, b"", "[]", inpoints_blob, tx.raw,
            )
            meta = TxMeta(
                txid=tx.txid, fee=fees[i], size_in_bytes=tx.size, is_coinbase=coinbase,
                version=tx.version, locktime=tx.locktime, inpoints=inpoints, locked=locked,
                conflicting=conflicting, unmined_since=unmined_since, created_at=now,
                delete_at_height=dah, spending_height=spending_height,
                block_ids=[b[0] for b in blocks], block_heights=[b[1] for b in blocks],
                subtree_idxs=[b[2] for b in blocks], total_utxos=len(outs), tx=tx,
            )
            todo.append((i, tx, meta, row, outs))

        def unit(cur: Any) -> list[int]:
            existing: set[bytes] = set()
            for part in chunks([t[1].txid for t in todo]):
                existing.update(bytes(r[0]) for r in self._select_txs(cur, "txid", part, False))
            new = [t for t in todo if t[1].txid not in existing]
            new.sort(key=lambda t: t[1].txid)  # one insertion order for every writer: no deadlocks
            if new:
                cur.executemany(self._q(INSERT_TX), [t[3] for t in new])
                if cur.rowcount != len(new):
                    raise _Raced()
                cur.executemany(self._q(INSERT_OUTPUT), [o for t in new for o in t[4]])
            return [t[0] for t in todo if t[1].txid in existing]

        for _attempt in range(self.max_retries):
            try:
                dup_idx = self._run_write("create", unit)
                break
            except _Raced:
                continue
        else:
            raise ProcessingError("create kept racing with concurrent creators of the same txids")
        dups = set(dup_idx)
        for i, tx, meta, _row, _outs in todo:
            results[i] = (
                TxExists(f"tx {hash_to_hex(tx.txid)} already exists", txid=tx.txid)
                if i in dups
                else meta
            )
        return results

    def _fees(self, txs: Sequence[Tx]) -> list[int | None]:
        """Each tx's fee; previous outputs a non-extended tx lacks come from the batch or store."""
        need: set[tuple[bytes, int]] = set()
        for tx in txs:
            if not tx.is_coinbase:
                need.update((i.prev_txid, i.prev_vout) for i in tx.inputs if i.prev_satoshis is None)
        values: dict[tuple[bytes, int], int] = {}
        if need:
            in_batch = {t.txid: t for t in txs}
            for txid, vout in list(need):
                parent = in_batch.get(txid)
                if parent is not None and vout < len(parent.outputs):
                    values[(txid, vout)] = parent.outputs[vout].satoshis
                    need.discard((txid, vout))
            if need:
                for key, info in self.get_outputs(sorted(need)).items():
                    values[key] = info.satoshis
        fees: list[int | None] = []
        for tx in txs:
            if tx.is_coinbase:
                fees.append(0)
                continue
            total = 0
            for i in tx.inputs:
                v = i.prev_satoshis if i.prev_satoshis is not None else values.get((i.prev_txid, i.prev_vout))
                if v is None:
                    total = -1
                    break
                total += v
            fees.append(None if total < 0 else total - sum(o.satoshis for o in tx.outputs))
        return fees


class ImportMixin(SqlBase):
    def import_utxos(self, utxos: Sequence[Utxo], block_id: int = 0) -> int:
        """Seed records from a UTXO snapshot (no raw transactions): one record per txid, mined at
        each entry's height, holding just the listed outputs. Existing txids are TxExists."""
        by_tx: dict[bytes, list[Utxo]] = {}
        for u in utxos:
            by_tx.setdefault(u.txid, []).append(u)
        now = int(time.time() * 1000)
        height = self._height()
        tx_rows = []
        out_rows = []
        for txid, us in sorted(by_tx.items()):
            h = us[0].height or 0
            coinbase = us[0].coinbase
            slots = [u for u in us if not is_data_carrier(u.satoshis, u.script)]
            dah = next_dah(
                current=None, conflicting=False, locked=False, preserve_until=None, spent=0,
                utxos=len(slots), mined_on_longest=True, height=height, retention=self.retention,
            )
            tx_rows.append((
                txid, 0, 0, None, 0, int(coinbase), h + COINBASE_MATURITY if coinbase else 0,
                0, 0, 0, None, now, None, dah, 0, 0, len(slots), 0,
                json.dumps([[block_id, h, 0]], separators=(",", ":")), b"", "[]", b"", None,
            ))
            out_rows += [
                (txid, u.vout, utxo_hash(txid, u.vout, u.script, u.satoshis), u.satoshis, u.script, 0)
                for u in slots
            ]

        def unit(cur: Any) -> int:
            for part in chunks([r[0] for r in tx_rows]):
                found = self._select_txs(cur, "txid", part, False)
                if found:
                    t = bytes(found[0][0])
                    raise TxExists(f"snapshot tx {hash_to_hex(t)} already exists", txid=t)
            cur.executemany(self._q(INSERT_TX), tx_rows)
            cur.executemany(self._q(INSERT_OUTPUT), out_rows)
            return len(out_rows)

        return self._run_write("import_utxos", unit)
