"""Real mainnet blocks through the sequencer, on every backend: blocks 1–255 from the genesis'
child, and blocks 413567 and 277647 over snapshots of the outputs they spend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chain import hex_to_hash, is_data_carrier, iter_blk_records, parse_block
from chain.muhash import MuHash, coin_bytes
from stores.state import BlockStatus
from stores.utxo import Utxo, UtxoStore
from tests.pipeline.chains import commitment_model, confirmed, confirmed_model
from workers.chainstate.commitment import muhash_hex
from workers.chainstate.sequencer import Sequencer

SUBSIDY = 25 * 10**8  # both snapshot blocks are in the third halving era


def test_blocks_1_to_255(seq: Sequencer, data_dir: Path) -> None:
    raws = [raw for _off, raw in iter_blk_records((data_dir / "mainnet-1-255.blk").read_bytes())]
    blocks = [parse_block(r) for r in raws]
    assert len(raws) == 255
    for raw in raws:
        e = seq.submit(raw)
        assert e.status is BlockStatus.APPLIED, e
    tip = seq.state.tip()
    assert tip is not None and tip.height == 255 and tip.hash == blocks[-1].hash
    first = seq.state.get_block(blocks[0].hash)
    assert first is not None and first.height == 1
    assert confirmed(seq.utxo) == confirmed_model([b.txs for b in blocks])
    # the commitment, block by block, is the model's; at the tip, also the store's own listing's
    for k in (0, 1, 50, 169, 170, 200, 254):
        c = seq.state.get_commitment(blocks[k].hash)
        assert c is not None
        assert (muhash_hex(c), c.utxos, c.satoshis) == commitment_model([b.txs for b in blocks[: k + 1]], 1)
    assert (muhash_hex(c), c.utxos, c.satoshis) == from_listing(seq.utxo)
    # the first spend ever: block 170 spends the coinbase of block 9
    spender = next(t for b in blocks for t in b.txs if not t.is_coinbase)
    out = seq.utxo.get_output((spender.inputs[0].prev_txid, spender.inputs[0].prev_vout))
    assert out is not None and out.spending_txid == spender.txid


def from_listing(utxo: UtxoStore) -> tuple[str, int, int]:
    """(MuHash, outputs, satoshis) of the store's confirmed listing (`utxo utxos --confirmed`)."""
    h, n, sats = MuHash(), 0, 0
    for u in utxo.iter_utxos(confirmed=True):
        assert u.height is not None
        h.insert(coin_bytes(u.txid, u.vout, u.height, u.coinbase, u.satoshis, u.script))
        n, sats = n + 1, sats + u.satoshis
    return h.hex(), n, sats


def snapshot(data_dir: Path, height: int) -> list[Utxo]:
    """The outputs block `height` spends, but those it creates itself (as `utxo import-utxos`
    skips entries above the snapshot's height)."""
    out = []
    for line in (data_dir / f"mainnet-{height}.prevouts.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["height"] < height:
            out.append(Utxo(hex_to_hash(d["txid"]), d["vout"], d["value"], bytes.fromhex(d["script"]),
                            d["height"], d["coinbase"]))
    return out


@pytest.mark.parametrize(("height", "fees"), [(413567, 31_310_238), (277647, 4_737_355)])
def test_a_block_over_a_snapshot_of_what_it_spends(
    seq: Sequencer, data_dir: Path, height: int, fees: int
) -> None:
    raw = (data_dir / f"mainnet-{height}.block").read_bytes()
    block = parse_block(raw)
    utxos = snapshot(data_dir, height)
    snap_hash = block.header.prev_hash
    if height == 413567:
        assert snap_hash == hex_to_hash("00000000000000000542b54d29b12b523ff6c6474e0e86085bd3005ec6c5ce11")
    assert seq.utxo.import_utxos(utxos, height=height - 1, block_hash=snap_hash) == len(utxos)
    assert seq.applier.allow_missing_inputs is False
    e = seq.submit(raw)
    assert e.status is BlockStatus.APPLIED and e.height == height, e
    tip = seq.state.tip()
    assert tip is not None and tip.hash == block.hash and tip.height == height
    # every input was found and spent by its transaction
    ins = {(i.prev_txid, i.prev_vout): t.txid for t in block.txs[1:] for i in t.inputs}
    outs = seq.utxo.get_outputs(list(ins))
    assert len(outs) == len(ins) == sum(len(t.inputs) for t in block.txs[1:])
    assert {op: o.spending_txid for op, o in outs.items()} == ins
    # the fees add up to what the coinbase claims above the subsidy
    metas = [seq.utxo.get(t.txid, ["fee", "block_heights"]) for t in block.txs]
    assert all(list(m.block_heights) == [height] for m in metas)
    assert all(m.fee is not None and m.fee >= 0 for m in metas[1:])
    coinbase_out = sum(o.satoshis for o in block.txs[0].outputs)
    assert sum(m.fee or 0 for m in metas[1:]) == coinbase_out - SUBSIDY == fees
    model = confirmed_model([block.txs], base=((u.txid, u.vout) for u in utxos))
    assert confirmed(seq.utxo) == model
    made = sum(1 for t in block.txs for o in t.outputs if not is_data_carrier(o.satoshis, o.script))
    assert seq.utxo.stats().utxos == len(utxos) + made - len(ins)
    # the block's commitment: the snapshot's set (computed from the store, which held just it)
    # with the block's change applied; the model's, and the store's listing's
    c = seq.state.get_commitment(block.hash)
    assert c is not None and c.utxos == len(utxos) + made - len(ins)
    assert (muhash_hex(c), c.utxos, c.satoshis) == commitment_model([block.txs], height, utxos)
    assert (muhash_hex(c), c.utxos, c.satoshis) == from_listing(seq.utxo)
