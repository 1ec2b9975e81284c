"""Spending, unspending, and the per-output states freeze / unfreeze / reassign.

Invariants:
- A transaction's spend is all-or-nothing: its inputs are checked against the rows read under
  lock (and against earlier transactions of the same batch), and only a transaction whose every
  input passes has its spends written.
- `spent_utxos` of a parent always equals the number of its output rows with spending data, and
  its delete-at-height is recomputed in the same database transaction that changes the count.
- Unspend clears only a spend whose stored spender equals the one given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from chain import Tx, hash_to_hex, utxo_hash
from stores.utxo.errors import (
    Outpoint,
    ProcessingError,
    SpendRejected,
    TxNotFound,
    UtxoError,
    UtxoMismatch,
    UtxoNotFound,
    UtxoSpent,
    fmt_outpoint,
)
from stores.utxo.records import Spend
from stores.utxo.rules import REASSIGN_DELAY, check_spend, next_dah
from stores.utxo.sql.base import SqlBase, chunks

SPEND_PARENT_COLS = (
    "txid, creating, conflicting, locked, is_coinbase, spending_height, total_utxos, spent_utxos, "
    "unmined_since, preserve_until, delete_at_height, blocks"
)
OUT_COLS = "o.txid, o.vout, o.utxo_hash, o.spending_txid, o.spending_vin, o.frozen, o.spendable_in"
SET_SPEND = "UPDATE outputs SET spending_txid = ?, spending_vin = ? WHERE txid = ? AND vout = ?"
SET_COUNT = "UPDATE txs SET spent_utxos = ?, delete_at_height = ? WHERE txid = ?"


class _Parent:
    __slots__ = ("check", "total", "spent", "unmined", "preserve", "dah", "mined", "changed")

    def __init__(self, r: tuple[Any, ...]) -> None:
        self.check = (bool(r[1]), bool(r[2]), bool(r[3]), bool(r[4]), r[5])
        self.total, self.spent = r[6], r[7]
        self.unmined, self.preserve, self.dah = r[8], r[9], r[10]
        self.mined = r[8] is None and r[11] != "[]"
        self.changed = False

    def dah_after(self, height: int, retention: int) -> int | None:
        creating, conflicting, locked, _cb, _sh = self.check
        return next_dah(
            current=self.dah, conflicting=conflicting, locked=locked, preserve_until=self.preserve,
            spent=self.spent, utxos=self.total, mined_on_longest=self.mined, height=height,
            retention=retention,
        )


class SpendMixin(SqlBase):
    def _lock_parents(self, cur: Any, txids: set[bytes]) -> dict[bytes, _Parent]:
        parents: dict[bytes, _Parent] = {}
        for part in chunks(sorted(txids)):
            for r in self._select_txs(cur, SPEND_PARENT_COLS, part, True):
                parents[bytes(r[0])] = _Parent(r)
        return parents

    def _load_outputs(self, cur: Any, keys: list[Outpoint]) -> dict[Outpoint, list[Any]]:
        outs: dict[Outpoint, list[Any]] = {}
        for part in chunks(keys):
            for r in self._select_outputs(cur, OUT_COLS, part):
                outs[(bytes(r[0]), r[1])] = [
                    bytes(r[2]), None if r[3] is None else bytes(r[3]), r[4], bool(r[5]), r[6]
                ]
        return outs

    def _write_counts(self, cur: Any, parents: dict[bytes, _Parent], height: int) -> None:
        rows = []
        for txid, p in parents.items():
            if p.changed:
                p.dah = p.dah_after(height, self.retention)
                rows.append((p.spent, p.dah, txid))
        if rows:
            cur.executemany(self._q(SET_COUNT), rows)

    def spend(self, tx: Tx, block_height: int) -> list[Spend]:
        (r,) = self.spend_many([tx], block_height)
        if isinstance(r, UtxoError):
            raise r
        return r

    def spend_many(self, txs: Sequence[Tx], block_height: int) -> list[list[Spend] | UtxoError]:
        plans: list[list[tuple[int, Outpoint, bytes | None]]] = []
        keys: set[Outpoint] = set()
        for tx in txs:
            plan = []
            if not tx.is_coinbase:
                for vin, i in enumerate(tx.inputs):
                    op = (i.prev_txid, i.prev_vout)
                    expected = (
                        utxo_hash(i.prev_txid, i.prev_vout, i.prev_script, i.prev_satoshis)
                        if i.prev_script is not None and i.prev_satoshis is not None
                        else None
                    )
                    plan.append((vin, op, expected))
                    keys.add(op)
            plans.append(plan)
        height = self._height(block_height)

        def unit(cur: Any) -> list[list[Spend] | UtxoError]:
            parents = self._lock_parents(cur, {k[0] for k in keys})
            outs = self._load_outputs(cur, sorted(keys))
            results: list[list[Spend] | UtxoError] = []
            writes: list[tuple[bytes, int, bytes, int]] = []
            for tx, plan in zip(txs, plans):
                errors: list[tuple[int, UtxoError]] = []
                spends: list[Spend] = []
                fresh: list[tuple[Outpoint, int]] = []
                for vin, op, expected in plan:
                    p = parents.get(op[0])
                    o = outs.get(op)
                    err = check_spend(
                        op, expected, (tx.txid, vin), block_height,
                        None if p is None else p.check,
                        None if o is None else (o[0], o[1], o[2], o[3], o[4]),
                    )
                    if err is not None:
                        errors.append((vin, err))
                        continue
                    assert o is not None
                    spends.append(Spend(op[0], op[1], o[0], tx.txid, vin))
                    if o[1] is None:
                        fresh.append((op, vin))
                if errors:
                    results.append(SpendRejected(tx.txid, errors))
                    continue
                seen: set[Outpoint] = set()
                for op, vin in fresh:
                    if op in seen:  # one tx spending the same outpoint twice
                        results.append(SpendRejected(tx.txid, [(vin, UtxoSpent(
                            f"output {fmt_outpoint(op)} is spent twice by the same tx",
                            outpoint=op, spending_txid=tx.txid, spending_vin=vin))]))
                        break
                    seen.add(op)
                else:
                    for op, vin in fresh:
                        o = outs[op]
                        o[1], o[2] = tx.txid, vin
                        p = parents[op[0]]
                        p.spent += 1
                        p.changed = True
                        writes.append((tx.txid, vin, op[0], op[1]))
                    results.append(spends)
            if writes:
                cur.executemany(self._q(SET_SPEND), writes)
            self._write_counts(cur, parents, height)
            return results

        return self._run_write("spend", unit)

    def unspend(self, spends: Sequence[Spend]) -> list[bool]:
        keys = sorted({(s.txid, s.vout) for s in spends})
        height = self._height()

        def unit(cur: Any) -> list[bool]:
            parents = self._lock_parents(cur, {k[0] for k in keys})
            outs = self._load_outputs(cur, keys)
            cleared: list[bool] = []
            writes = []
            for s in spends:
                o = outs.get((s.txid, s.vout))
                if o is None or o[1] != s.spending_txid or o[2] != s.spending_vin or o[3]:
                    cleared.append(False)
                    continue
                o[1] = o[2] = None
                p = parents[s.txid]
                p.spent -= 1
                p.changed = True
                writes.append((None, None, s.txid, s.vout))
                cleared.append(True)
            if writes:
                cur.executemany(self._q(SET_SPEND), writes)
            self._write_counts(cur, parents, height)
            return cleared

        return self._run_write("unspend", unit)

    # -- freeze / unfreeze / reassign --------------------------------------------------------------
    def _per_output(
        self, what: str, items: Sequence[tuple[Outpoint, bytes]], act: Any
    ) -> list[UtxoError | None]:
        keys = sorted({op for op, _h in items})

        def unit(cur: Any) -> list[UtxoError | None]:
            parents = self._lock_parents(cur, {k[0] for k in keys})
            outs = self._load_outputs(cur, keys)
            result: list[UtxoError | None] = []
            for op, h in items:
                o = outs.get(op)
                if op[0] not in parents:
                    result.append(TxNotFound(f"tx of {fmt_outpoint(op)} not found", outpoint=op))
                elif o is None:
                    result.append(UtxoNotFound(f"output {fmt_outpoint(op)} does not exist", outpoint=op))
                elif o[0] != h:
                    result.append(UtxoMismatch(
                        f"output {fmt_outpoint(op)}: utxo hash {hash_to_hex(h)} does not match",
                        outpoint=op))
                else:
                    result.append(act(cur, op, o))
            return result

        return self._run_write(what, unit)

    def freeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        def act(cur: Any, op: Outpoint, o: list[Any]) -> UtxoError | None:
            if o[3]:
                return None
            if o[1] is not None:
                return UtxoSpent(
                    f"output {fmt_outpoint(op)} is spent by {hash_to_hex(o[1])}:{o[2]}; "
                    "only an unspent output can be frozen",
                    outpoint=op, spending_txid=o[1], spending_vin=o[2])
            o[3] = True
            cur.execute(self._q("UPDATE outputs SET frozen = 1 WHERE txid = ? AND vout = ?"), op)
            return None

        return self._per_output("freeze", items, act)

    def unfreeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        def act(cur: Any, op: Outpoint, o: list[Any]) -> UtxoError | None:
            if not o[3]:
                return ProcessingError(f"output {fmt_outpoint(op)} is not frozen", outpoint=op)
            o[3] = False
            cur.execute(self._q("UPDATE outputs SET frozen = 0 WHERE txid = ? AND vout = ?"), op)
            return None

        return self._per_output("unfreeze", items, act)

    def reassign(self, outpoint: Outpoint, utxo_hash: bytes, new_utxo_hash: bytes) -> None:
        height = self._height()
        if height <= 0:
            raise ProcessingError("reassign needs the current block height (set_block_height)")

        def act(cur: Any, op: Outpoint, o: list[Any]) -> UtxoError | None:
            if not o[3]:
                return ProcessingError(
                    f"output {fmt_outpoint(op)} must be frozen before it is reassigned", outpoint=op)
            cur.execute(
                self._q("UPDATE outputs SET utxo_hash = ?, frozen = 0, spendable_in = ? "
                        "WHERE txid = ? AND vout = ?"),
                (new_utxo_hash, height + REASSIGN_DELAY, op[0], op[1]),
            )
            cur.execute(self._q("SELECT reassignments FROM txs WHERE txid = ?"), (op[0],))
            entries = json.loads(cur.fetchone()[0])
            entries.append({
                "offset": op[1], "utxo_hash": hash_to_hex(utxo_hash),
                "new_utxo_hash": hash_to_hex(new_utxo_hash), "block_height": height,
            })
            cur.execute(self._q("UPDATE txs SET reassignments = ? WHERE txid = ?"),
                        (json.dumps(entries), op[0]))
            return None

        (err,) = self._per_output("reassign", [(outpoint, utxo_hash)], act)
        if err is not None:
            raise err
