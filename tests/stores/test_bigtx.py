"""Scale: a one-million-output transaction created (two-phase, 50 records), spent and mined in a
process of its own (`python -m bench.bigtx`) whose peak RSS stays under 512 MB, on every backend;
and the pieces that keep it bounded (the bench's own serialization, the blob's extended bytes)
checked against the straightforward ones."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bigtx import BATCH, RSS_LIMIT_MB, generate
from chain import Tx, hex_to_hash, parse_block
from chain.build import build_tx, coinbase_tx, p2pkh
from stores.utxo.aerospike.codec import DEFAULT_BATCH_SIZE
from stores.utxo.external import extended_bytes

ROOT = Path(__file__).resolve().parent.parent.parent
OUTPUTS = 1_000_000


def test_a_million_output_tx_is_created_spent_and_mined_in_bounded_memory(
    store_url: str, data_dir: Path
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bigtx",
            "--url",
            store_url,
            "--outputs",
            str(OUTPUTS),
            "--data",
            str(data_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["bench"] == "bigtx" and r["outputs"] == OUTPUTS
    assert r["backend"] == store_url.split(":", 1)[0]
    batch = r["batch_size"]
    assert batch == (BATCH if r["backend"] != "aerospike" else DEFAULT_BATCH_SIZE)
    assert r["spends_ok"] and r["spent_vouts"] == [0, batch - 1, batch, OUTPUTS - 1]
    assert r["spent_utxos"] == 4 and r["total_utxos"] == OUTPUTS
    assert r["creating"] is False and r["external"] is True and r["block_ids"] == [2]
    assert r["total_extra_recs"] == -(-OUTPUTS // batch) - 1 == (49 if batch == BATCH else 976)
    assert r["view_utxos"] == OUTPUTS - 4  # the confirmed view walked every page
    assert r["megatx_ok"] and r["megatx_bytes"] == 999_657
    assert r["megatx_txid"].startswith("bb41a757")
    assert r["rss_limit_mb"] == RSS_LIMIT_MB == 512
    assert r["peak_rss_mb"] < RSS_LIMIT_MB, r["rss_after_mb"]


@pytest.mark.parametrize("n", [1, 2, 300, BATCH + 1, 70_000])
def test_the_bench_serializes_its_big_tx_as_build_tx_does(n: int) -> None:
    funding, big, spender = generate(n)
    ref = build_tx(big.inputs, big.outputs)
    assert big.raw == ref.raw and big.txid == ref.txid
    assert big.is_extended and big.inputs[0].prev_txid == funding.txid
    assert len(big.outputs) == n and len({o.satoshis for o in big.outputs}) == n
    assert [i.prev_txid for i in spender.inputs] == [big.txid] * len(spender.inputs)


def _extended_block_txs(data_dir: Path) -> list[Tx]:
    """Block 413567's transactions, each input carrying its previous output (from the
    prevouts file, or an earlier transaction of the block)."""
    block = parse_block((data_dir / "mainnet-413567.block").read_bytes())
    prev: dict[tuple[bytes, int], tuple[int, bytes]] = {}
    for line in (data_dir / "mainnet-413567.prevouts.jsonl").read_text().splitlines():
        d = json.loads(line)
        prev[(hex_to_hash(d["txid"]), d["vout"])] = (d["value"], bytes.fromhex(d["script"]))
    out = [block.txs[0]]
    for tx in block.txs[1:]:
        ins = []
        for i in tx.inputs:
            sats, script = prev[(i.prev_txid, i.prev_vout)]
            ins.append(dataclasses.replace(i, prev_satoshis=sats, prev_script=script))
        out.append(dataclasses.replace(tx, inputs=ins))
    return out


def test_extended_bytes_equal_the_extended_serialization(data_dir: Path) -> None:
    txs = [*_extended_block_txs(data_dir), *generate(BATCH + 5)]
    txs.append(coinbase_tx(7, [(50, p2pkh(b"\x01" * 20)), (0, b"\x6a\x01\x02")]))
    assert max(len(t.inputs) for t in txs) >= 0xFD  # a multi-byte input count too
    for tx in txs:
        assert tx.is_extended
        assert extended_bytes(tx) == tx.serialize(extended=True), tx.txid_hex


def test_iter_outputs_reads_standard_and_extended_bytes_as_the_parser_does(data_dir: Path) -> None:
    from chain.tx import iter_outputs

    for tx in _extended_block_txs(data_dir):
        want = [(v, o.satoshis, o.script) for v, o in enumerate(tx.outputs)]
        assert list(iter_outputs(tx.raw)) == want
        assert list(iter_outputs(tx.serialize(extended=True))) == want
