"""The output values a SQL store keeps of what it created last (for fees): right values,
bounded, and holding nothing of the parsed transactions (a kept `TxOut` would pin the freed
memory of a whole parsed block)."""

from __future__ import annotations

import gc

from chain import Tx, TxIn, parse_tx
from chain.build import build_tx, p2pkh
from stores.utxo.prevouts import RecentOutputs


def tx_with(values: list[int], tag: int) -> Tx:
    spend = TxIn(tag.to_bytes(32, "big"), 0, b"\x51", 0xFFFFFFFF, sum(values) + 1000, p2pkh(b"\x01" * 20))
    return build_tx([spend], [(v, p2pkh(bytes([k]) * 20)) for k, v in enumerate(values)])


def test_values_by_outpoint() -> None:
    recent = RecentOutputs()
    a, b = tx_with([5, 2**64 - 1, 0], 1), tx_with([21 * 10**14], 2)  # any value the wire holds
    recent.add(a)
    recent.add(b)
    assert [recent.get(a.txid, v) for v in range(3)] == [5, 2**64 - 1, 0]
    assert recent.get(b.txid, 0) == 21 * 10**14
    assert recent.get(b.txid, 1) is None  # no such output
    assert recent.get(b"\x07" * 32, 0) is None  # never seen


def test_bounded_oldest_first_and_huge_left_out() -> None:
    recent = RecentOutputs(max_outputs=8)
    txs = [tx_with([1, 2], k) for k in range(6)]  # 12 outputs: the first two txs go
    for t in txs:
        recent.add(t)
    assert [recent.get(t.txid, 1) for t in txs] == [None, None, 2, 2, 2, 2]
    huge = tx_with([1, 1, 1], 99)  # more than a quarter of the bound: would push the rest out
    recent.add(huge)
    assert recent.get(huge.txid, 0) is None
    assert recent.get(txs[-1].txid, 0) == 1


def test_keeps_no_object_of_the_parsed_transaction() -> None:
    recent = RecentOutputs()
    tx = parse_tx(tx_with([7, 8], 3).raw)
    parsed = {id(tx.txid), id(tx.outputs), *(id(o) for o in tx.outputs), *(id(o.script) for o in tx.outputs)}
    recent.add(tx)
    held = gc.get_referents(recent._values)
    held_ids = {id(x) for x in held}
    assert held_ids.isdisjoint(parsed)
    assert recent.get(tx.txid, 1) == 8
