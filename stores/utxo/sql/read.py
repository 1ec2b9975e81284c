"""Reads: records, spend status, outputs, the UTXO views and their totals.

Invariants:
- Reads take no locks and never change anything.
- The confirmed view is exactly CONTRACT.md's: outputs of transactions mined on the best chain
  (and not conflicting) that no transaction mined on the best chain has spent. It is streamed
  from the database, so listing a million UTXOs needs constant memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from chain import hash_to_hex, parse_tx
from stores.utxo.errors import (
    Outpoint,
    ProcessingError,
    TxCoinbaseImmature,
    TxConflicting,
    TxLocked,
    TxNotFound,
    UtxoFrozen,
    UtxoSpent,
)
from stores.utxo.records import OutputInfo, SpendInfo, SpendStatus, TxMeta, Utxo, UtxoStats
from stores.utxo.rules import check_spend
from stores.utxo.sql.base import SqlBase, chunks, split_inpoints
from stores.utxo.sql.create import TX_COLS

FIELDS = frozenset(TxMeta.__dataclass_fields__)
OUTPUT_COLS = (
    "o.txid, o.vout, o.utxo_hash, o.satoshis, o.script, o.spending_txid, o.spending_vin, "
    "o.frozen, o.spendable_in"
)
_MINED = "t.unmined_since IS NULL AND t.blocks <> '[]' AND t.conflicting = 0"
_UNSPENT_ON_CHAIN = (
    "(o.spending_txid IS NULL OR NOT EXISTS (SELECT 1 FROM txs s WHERE s.txid = o.spending_txid "
    "AND s.unmined_since IS NULL AND s.blocks <> '[]'))"
)


def _output(r: Sequence[Any]) -> OutputInfo:
    return OutputInfo(
        bytes(r[0]), r[1], bytes(r[2]), r[3], bytes(r[4]),
        None if r[5] is None else bytes(r[5]), r[6], bool(r[7]), r[8],
    )


class ReadMixin(SqlBase):
    def get(self, txid: bytes, fields: Sequence[str] | None = None) -> TxMeta:
        if fields is not None:
            unknown = set(fields) - FIELDS
            if unknown:
                raise ProcessingError(f"unknown record fields: {', '.join(sorted(unknown))}")

        def q(cur: Any) -> Any:
            cur.execute(self._q(f"SELECT {TX_COLS} FROM txs WHERE txid = ?"), (txid,))
            return cur.fetchone()

        r = self._run_read("get", q)
        if r is None:
            raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
        blocks = json.loads(r[18])
        kids = bytes(r[19])
        meta = TxMeta(
            txid=bytes(r[0]), version=r[1], locktime=r[2], fee=r[3], size_in_bytes=r[4],
            is_coinbase=bool(r[5]), spending_height=r[6], locked=bool(r[7]), creating=bool(r[8]),
            conflicting=bool(r[9]), unmined_since=r[10], created_at=r[11], preserve_until=r[12],
            delete_at_height=r[13], external=bool(r[14]), total_extra_recs=r[15],
            total_utxos=r[16], spent_utxos=r[17], block_ids=[b[0] for b in blocks],
            block_heights=[b[1] for b in blocks], subtree_idxs=[b[2] for b in blocks],
            conflicting_children=[kids[i : i + 32] for i in range(0, len(kids), 32)],
            reassignments=json.loads(r[20]), inpoints=split_inpoints(bytes(r[21])),
        )
        if (fields is None or "tx" in fields) and r[22] is not None:
            meta.tx = parse_tx(bytes(r[22]))
        return meta

    def get_outputs(self, outpoints: Sequence[Outpoint]) -> dict[Outpoint, OutputInfo]:
        keys = sorted(set(outpoints))

        def q(cur: Any) -> dict[Outpoint, OutputInfo]:
            out: dict[Outpoint, OutputInfo] = {}
            for part in chunks(keys):
                for r in self._select_outputs(cur, OUTPUT_COLS, part):
                    info = _output(r)
                    out[(info.txid, info.vout)] = info
            return out

        return self._run_read("get_outputs", q)

    def get_output(self, outpoint: Outpoint) -> OutputInfo | None:
        return self.get_outputs([outpoint]).get(outpoint)

    def get_spend(self, outpoint: Outpoint, utxo_hash: bytes) -> SpendInfo:
        def q(cur: Any) -> tuple[Any, Any]:
            parents = self._select_txs(
                cur, "txid, creating, conflicting, locked, is_coinbase, spending_height", [outpoint[0]], False
            )
            outs = self._select_outputs(cur, OUTPUT_COLS, [outpoint])
            return (parents[0] if parents else None), (outs[0] if outs else None)

        p, o = self._run_read("get_spend", q)
        info = None if o is None else _output(o)
        err = check_spend(
            outpoint, utxo_hash, (b"", -1), self.block_height,
            None if p is None else (bool(p[1]), bool(p[2]), bool(p[3]), bool(p[4]), p[5]),
            None if info is None else (
                info.utxo_hash, info.spending_txid, info.spending_vin, info.frozen, info.spendable_in
            ),
        )
        if err is None:
            return SpendInfo(SpendStatus.OK)
        if isinstance(err, UtxoSpent):
            return SpendInfo(SpendStatus.SPENT, err.spending_txid, err.spending_vin)
        if isinstance(err, TxLocked):
            return SpendInfo(SpendStatus.LOCKED)
        if isinstance(err, TxConflicting):
            return SpendInfo(SpendStatus.CONFLICTING)
        if isinstance(err, TxCoinbaseImmature):
            return SpendInfo(SpendStatus.IMMATURE, until=err.spendable_at)
        if isinstance(err, UtxoFrozen):
            return SpendInfo(SpendStatus.FROZEN, until=err.until)
        return SpendInfo(SpendStatus.NOT_FOUND)

    def iter_utxos(self, *, confirmed: bool = True, script: bytes | None = None) -> Iterator[Utxo]:
        where = f"{_MINED} AND {_UNSPENT_ON_CHAIN}" if confirmed else (
            "o.spending_txid IS NULL AND t.conflicting = 0"
        )
        params: list[Any] = []
        if script is not None:
            where += " AND o.script = ?"
            params.append(script)
        sql = (
            "SELECT o.txid, o.vout, o.satoshis, o.script, t.blocks, t.is_coinbase "
            f"FROM outputs o JOIN txs t ON t.txid = o.txid WHERE {where} ORDER BY o.txid, o.vout"
        )
        last_blocks: str | None = None
        height: int | None = None
        try:
            for r in self._stream(self._q(sql), params):
                if r[4] != last_blocks:
                    last_blocks = r[4]
                    heights = [b[1] for b in json.loads(r[4])]
                    height = min(heights) if heights else None
                yield Utxo(bytes(r[0]), r[1], r[2], bytes(r[3]), height, bool(r[5]))
        except self._db_errors() as e:
            from stores.utxo.errors import StorageError

            raise StorageError(f"listing UTXOs failed in {self.url_safe}: {e}") from e

    def stats(self) -> UtxoStats:
        def q(cur: Any) -> Any:
            cur.execute(
                "SELECT COUNT(*), COALESCE(SUM(o.satoshis), 0), COUNT(DISTINCT o.txid) "
                f"FROM outputs o JOIN txs t ON t.txid = o.txid WHERE {_MINED} AND {_UNSPENT_ON_CHAIN}"
            )
            return cur.fetchone()

        n, sats, txs = self._run_read("stats", q)
        return UtxoStats(utxos=int(n), satoshis=int(sats), txs=int(txs), height=self.block_height)
