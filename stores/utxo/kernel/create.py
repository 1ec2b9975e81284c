"""New records: what a transaction's records hold when they are created.

- A transaction with more outputs than the batch size B spans pages: the master (page 0) holds
  outputs 0…B-1 and every field of the data model; child page k holds outputs kB…(k+1)B-1.
- A slot holds the output's UTXO hash, unspent (or frozen, when the creation asks); a data
  carrier keeps its slot position with no UTXO in it. `total_utxos` counts real slots.
- A coinbase's outputs may be spent from `spending_height` = its height + COINBASE_MATURITY.
- A new record is mined on the longest chain when created in blocks (`unmined_since` unset),
  else unmined since the creation height; its delete-at-height is the rule's (`kernel.dah`).
- A multi-record transaction is created with `creating` set on every page and cleared children
  first, master last (`stores.utxo.twophase`); while the master has it, nothing of it is spent.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from hashlib import sha256
from typing import Any

from chain import Tx, utxo_hashes
from stores.utxo import slots
from stores.utxo.errors import ProcessingError, UtxoError
from stores.utxo.kernel.dah import apply_dah
from stores.utxo.kernel.record import NO_SPENDABLE, Block, Record, encode_blocks

COINBASE_MATURITY = 100
_u32 = struct.Struct("<I").pack


def refusal(tx: Tx) -> UtxoError | None:
    """Why `tx` cannot have a record, if it cannot: a transaction without outputs."""
    if not tx.outputs:
        return ProcessingError(f"tx {tx.txid_hex} has no outputs", txid=tx.txid)
    return None


def spending_height(is_coinbase: bool, height: int) -> int:
    """The first height a record's outputs may be spent at (0: any)."""
    return height + COINBASE_MATURITY if is_coinbase else 0


def page_count(n_outputs: int, batch_size: int) -> int:
    """How many records a transaction of `n_outputs` outputs needs (at least one)."""
    return max(1, -(-n_outputs // batch_size))


def tx_slots(tx: Tx, start: int = 0, stop: int | None = None, frozen: bool = False) -> tuple[bytes, int]:
    """The packed slots of outputs `start`…`stop`-1 of `tx` (all by default), unspent or frozen,
    and how many of them are real UTXOs."""
    outs = tx.outputs if start == 0 and stop is None else tx.outputs[start:stop]
    spend = slots.FROZEN if frozen else slots.UNSPENT
    hashes = utxo_hashes(tx.txid, outs, start)
    real = [h for h in hashes if h is not None]
    if len(real) < len(hashes):  # a data carrier keeps its slot position, with no UTXO in it
        empty = slots.EMPTY_SLOT
        return b"".join([empty if h is None else h + spend for h in hashes]), len(real)
    return spend.join(real) + spend, len(real)


def script_keys(scripts: Iterable[bytes]) -> bytes:
    """The packed script index keys of outputs with these scripts (`Record.script_keys`): the
    first 8 bytes of each script's SHA-256, which `stores.utxo.scriptindex.script_key` reads as the
    key (`masters` inlines this for a block's worth of transactions)."""
    return b"".join([sha256(s).digest()[:8] for s in scripts])


def count_utxos(tx: Tx) -> int:
    """Real UTXOs of the whole transaction (outputs that are not data carriers)."""
    return sum(h is not None for h in utxo_hashes(tx.txid, tx.outputs))


def page(tx: Tx, index: int, batch_size: int, frozen: bool = False) -> Record:
    """Child page `index` (≥ 1) of a multi-record transaction, `creating` set."""
    first, stop = index * batch_size, (index + 1) * batch_size
    packed, n = tx_slots(tx, first, stop, frozen)
    rec = Record(tx.txid, bytearray(packed), n, 0, creating=True, page=index)
    rec.script_keys = script_keys(o.script for o in tx.outputs[first:stop])
    return rec


def masters(
    height: int,
    blocks: Sequence[Block],
    *,
    batch_size: int,
    retention: int,
    dah_height: int,
    created_at: int,
    locked: bool = False,
    conflicting: bool = False,
    frozen: bool = False,
    external: bool = False,
) -> Callable[[Tx, int | None], Record]:
    """The maker of master records for transactions created alike — at `height`, in `blocks`
    or unmined, DAH by the rule at `dah_height` — called with each tx and its fee (a block's
    create call makes one per transaction). A transaction over one record counts all its UTXOs
    in its master."""
    blocks_json = encode_blocks(blocks)
    unmined = None if blocks else height
    sha = sha256
    maturity = spending_height(True, height)

    def make(tx: Tx, fee: int | None) -> Record:
        outs, ins = tx.outputs, tx.inputs
        extra = page_count(len(outs), batch_size) - 1 if len(outs) > batch_size else 0
        packed, n = tx_slots(tx, 0, batch_size if extra else None, frozen)
        coinbase = tx.is_coinbase
        rec = Record(  # positionally, in the field order: a block's create makes one per tx
            tx.txid, bytearray(packed), n, 0, False, 0, 0, tx.version, tx.locktime, fee, len(tx.raw),
            coinbase, maturity if coinbase else 0, locked, conflicting, unmined, created_at, None, None,
            external or extra > 0, extra, blocks_json, b"", b"", "[]", NO_SPENDABLE,
            b"" if coinbase else b"".join([i.prev_txid + _u32(i.prev_vout) for i in ins]),
            b"".join([sha(o.script).digest()[:8] for o in (outs[:batch_size] if extra else outs)]),
        )  # fmt: skip  (the keys: `script_keys`, inlined)
        if extra:
            rec.total_utxos = count_utxos(tx)  # the master counts the whole transaction
        apply_dah(rec, dah_height, retention)
        rec.dirty.clear()  # a new record is written whole
        return rec

    return make


def master(tx: Tx, height: int, blocks: Sequence[Block], fee: int | None, **alike: Any) -> Record:
    """The master record of one `tx` (see `masters`)."""
    return masters(height, blocks, **alike)(tx, fee)


def snapshot(
    txid: bytes,
    hashes: dict[int, bytes | None],
    scripts: dict[int, bytes],
    height: int,
    coinbase: bool,
    block: Block,
    *,
    batch_size: int,
    retention: int,
    dah_height: int,
    created_at: int,
    external: bool,
) -> Record:
    """The record of a snapshot entry group: mined in `block`, holding only the listed outputs
    (`hashes`: vout → UTXO hash, None for a data carrier; `scripts`: vout → its script). Outputs
    past the batch size go to the pages that hold them (in `pages`); a page no listed output
    needs is simply absent."""
    def keys(first: int, stop: int) -> bytes:
        return script_keys(scripts.get(v, b"") for v in range(first, stop))

    top = max(hashes)
    by_page: dict[int, list[int]] = {}
    for v in hashes:
        if v >= batch_size:
            by_page.setdefault(v // batch_size, []).append(v)
    rec = Record(
        txid,
        bytearray(slots.pack(hashes.get(v) for v in range(min(top + 1, batch_size)))),
        sum(h is not None for h in hashes.values()),
        0,
        is_coinbase=coinbase,
        spending_height=spending_height(coinbase, height),
        created_at=created_at,
        external=external,
        total_extra_recs=top // batch_size,
        blocks=encode_blocks([block]),
        script_keys=keys(0, min(top + 1, batch_size)),
    )
    for k, vs in sorted(by_page.items()):
        first, last = k * batch_size, max(vs)
        rec.pages[k] = Record(
            txid,
            bytearray(slots.pack(hashes.get(v) for v in range(first, last + 1))),
            sum(hashes[v] is not None for v in vs),
            0,
            page=k,
            script_keys=keys(first, last + 1),
        )
    apply_dah(rec, dah_height, retention)
    rec.dirty.clear()
    return rec
