"""Real mainnet blocks through two real workers, driven by the CLI as a user would: blocks 1–255
from a `blk*.dat` file (heights 1–255 from the genesis' child), and block 413567 over the
snapshot of what it spends (`utxo import-utxos` at 413566, then `utxo enqueue block`), every
input found. Each result is compared with the model of tests/pipeline/chains.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chain import hex_to_hash, iter_blk_records, parse_block
from tests.pipeline.chains import confirmed_model
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (the fixture)

SNAPSHOT_BLOCK = "00000000000000000542b54d29b12b523ff6c6474e0e86085bd3005ec6c5ce11"


@pytest.mark.timeout(300)
def test_blocks_1_to_255_from_a_blk_file(pipeline: Pipeline, data_dir: Path) -> None:
    raws = [raw for _off, raw in iter_blk_records((data_dir / "mainnet-1-255.blk").read_bytes())]
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    r = pipeline.utxo("enqueue", "block", str(data_dir / "mainnet-1-255.blk"))
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 255, r.stderr
    pipeline.wait(240)
    blocks = [parse_block(raw) for raw in raws]
    assert pipeline.tip() == {"height": 255, "hash": blocks[-1].hash_hex}
    assert pipeline.state_counts() == {"applied": 255}
    assert pipeline.confirmed() == confirmed_model([b.txs for b in blocks])


@pytest.mark.timeout(300)
def test_block_413567_over_its_snapshot(pipeline: Pipeline, data_dir: Path) -> None:
    r = pipeline.utxo("import-utxos", str(data_dir / "mainnet-413567.prevouts.jsonl"),
                      "--height", "413566", "--block-hash", SNAPSHOT_BLOCK)
    assert r.returncode == 0, r.stderr
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    r = pipeline.utxo("enqueue", "block", str(data_dir / "mainnet-413567.block"))
    assert r.returncode == 0, r.stderr
    pipeline.wait(240)
    block = parse_block((data_dir / "mainnet-413567.block").read_bytes())
    assert pipeline.tip() == {"height": 413567, "hash": block.hash_hex}
    got = json.loads(pipeline.utxo("block", block.hash_hex).stdout)
    assert got["status"] == "applied", got
    base = set()
    for line in (data_dir / "mainnet-413567.prevouts.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["height"] < 413567:  # what the block creates itself is not in the snapshot
            base.add((hex_to_hash(d["txid"]), d["vout"]))
    assert pipeline.confirmed() == confirmed_model([block.txs], base)
    store = pipeline.open_utxo()
    try:  # every input was found and spent by its own transaction
        ins = {(i.prev_txid, i.prev_vout): t.txid for t in block.txs[1:] for i in t.inputs}
        assert {op: o.spending_txid for op, o in store.get_outputs(list(ins)).items()} == ins
    finally:
        store.close()
