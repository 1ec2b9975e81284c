"""A UTXO snapshot's record, as every backend imports it (`utxo import-utxos`): one record per
txid, mined at its entries' height, holding just the listed outputs and their values and scripts.

Invariants: entries of one txid agree on height and coinbase and list each vout once, in range;
outputs too large for a record (or every one, with UTXO_EXTERNALIZE_ALL) go to the blob store,
written before the record that names them.
"""

from __future__ import annotations

from typing import Any

from chain import hash_to_hex, is_data_carrier, utxo_hash
from stores.utxo import slots, validate
from stores.utxo.errors import ProcessingError
from stores.utxo.kernel import create
from stores.utxo.kernel.record import Record
from stores.utxo.values import Utxo


def snapshot_record(
    store: Any, us: list[Utxo], block_id: int, now: int, height: int, done: list[int]
) -> tuple[Record, bytes | None]:
    """One snapshot record of `store`, checked entry by entry, and its outputs encoded (None:
    too large for a record, they went to the blob store as `.outputs`). `done` counts the
    slots and the records made."""
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
                f"snapshot output {hash_to_hex(txid)}:{u.vout}: vout out of range (0…{validate.MAX_VOUT})",
                txid=txid,
            )
        if u.vout in hashes:
            raise ProcessingError(f"snapshot lists output {hash_to_hex(txid)}:{u.vout} twice", txid=txid)
        hashes[u.vout] = (
            None if is_data_carrier(u.satoshis, u.script) else utxo_hash(txid, u.vout, u.script, u.satoshis)
        )
    items = sorted((u.vout, u.satoshis, u.script) for u in us)
    outputs: bytes | None = slots.encode_outputs(items)
    external = False
    assert outputs is not None
    if store.externalize_all or len(outputs) > store.max_tx_size_in_store:
        store.external.put_outputs(txid, h, coinbase, items)
        outputs, external = None, True
    rec = create.snapshot(
        txid,
        hashes,
        {u.vout: u.script for u in us},
        h,
        coinbase,
        (block_id, h, 0),
        batch_size=store.batch_size,
        retention=store.retention,
        dah_height=height,
        created_at=now,
        external=external,
    )
    done[0] += rec.total_utxos
    done[1] += 1
    return rec, outputs
