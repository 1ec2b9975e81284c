"""Small builders for store tests: funding records and spending transactions."""

from __future__ import annotations

import itertools

from chain import Tx, TxIn, utxo_hash
from chain.build import build_tx, coinbase_tx, p2pkh, spend_input
from stores.utxo import TxMeta, UtxoStore
from stores.utxo.kernel.record import Record

_seq = itertools.count(1)


def script(n: int | None = None) -> bytes:
    n = next(_seq) if n is None else n
    return p2pkh(n.to_bytes(20, "big"))


def funding(n_outputs: int = 2, value: int = 50_000) -> Tx:
    """A non-coinbase tx with made-up parents (unknown to the store) and fresh outputs."""
    parent = next(_seq).to_bytes(32, "big")
    return build_tx(
        [TxIn(parent, 0, b"\x51", 0xFFFFFFFF, value * n_outputs + 1000, script())],
        [(value, script()) for _ in range(n_outputs)],
    )


def child(*spent: tuple[Tx, int], n_outputs: int = 1, fee: int = 500) -> Tx:
    total = sum(t.outputs[v].satoshis for t, v in spent) - fee
    each = total // n_outputs
    return build_tx([spend_input(t, v) for t, v in spent], [(each, script()) for _ in range(n_outputs)])


def coinbase(height: int, value: int = 50 * 10**8) -> Tx:
    return coinbase_tx(height, [(value, script())], tag=next(_seq).to_bytes(4, "big"))


def uhash(tx: Tx, vout: int) -> bytes:
    o = tx.outputs[vout]
    return utxo_hash(tx.txid, vout, o.script, o.satoshis)


def created(store: UtxoStore, *txs: Tx, height: int = 100, mined: bool = False) -> None:
    from stores.utxo import BlockInfo

    infos = [BlockInfo(1, height, 0)] if mined else []
    for r in store.create_many(list(txs), height, infos):
        assert not isinstance(r, Exception), r


def as_record(meta: TxMeta) -> Record:
    """A kernel `Record` with what the store handed out for a master record (no slots): for
    holding a backend's fast paths to the kernel's rules."""
    from stores.utxo.kernel.record import encode_blocks

    return Record(
        meta.txid, bytearray(), meta.total_utxos, meta.spent_utxos, meta.creating,
        fee=meta.fee, is_coinbase=meta.is_coinbase, spending_height=meta.spending_height, locked=meta.locked,
        conflicting=meta.conflicting, unmined_since=meta.unmined_since, preserve_until=meta.preserve_until,
        delete_at_height=meta.delete_at_height, external=meta.external,
        total_extra_recs=meta.total_extra_recs,
        blocks=encode_blocks(list(zip(meta.block_ids, meta.block_heights, meta.subtree_idxs))),
    )
