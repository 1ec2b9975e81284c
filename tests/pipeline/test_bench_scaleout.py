"""`python -m bench.scaleout`: its chain is valid and reaches across the whole set, its check
tells a right store from a wrong one, and a small run on the user's path reports what it
promises. Its figures are the benchmark's business, not this test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.chaingen import MATURITY, generate
from bench.scaleout import check, fresh_stores
from chain import parse_block
from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.utxo import open_utxo_store
from tests.conftest import REDIS
from workers.chainstate.sequencer import Sequencer

ROOT = Path(__file__).resolve().parents[2]


def test_the_chain_is_deterministic_valid_and_spends_across_the_set() -> None:
    a = generate(6, 60, fan_blocks=2, seed=7)
    assert a.raws == generate(6, 60, fan_blocks=2, seed=7).raws
    assert a.raws != generate(6, 60, fan_blocks=2, seed=8).raws
    assert a.tip_height == MATURITY + 2 + 6 and a.setup == MATURITY + 2
    made_at: dict[tuple[bytes, int], int] = {}
    spent: set[tuple[bytes, int]] = set()
    reach = []
    for height, raw in enumerate(a.raws, 1):
        block = parse_block(raw)
        for tx in block.txs:
            for i in ([] if tx.is_coinbase else tx.inputs):
                op = (i.prev_txid, i.prev_vout)
                assert op in made_at and op not in spent, "spends an output that is not there"
                born = made_at[op]
                if born < 0:  # a coinbase: 100 blocks deep at least
                    assert height + born >= MATURITY
                    born = -born
                reach.append(height - born)
                spent.add(op)
            for v, o in enumerate(tx.outputs):
                assert o.satoshis > 0
                made_at[(tx.txid, v)] = -height if tx.is_coinbase else height
    # the main blocks draw from everything before them, not only the last block
    assert max(reach) >= 5 and any(r == 0 for r in reach)
    assert {op for op in made_at if op not in spent} == set(a.coins)


def _apply(chain_raws: list[bytes], urls: dict[str, str]) -> None:
    utxo = open_utxo_store(urls["store"], blob_url=urls["blobs"])
    state = open_state_store(urls["state"])
    try:
        seq = Sequencer(utxo, state, open_blob_store(urls["blobs"]))
        for raw in chain_raws:
            seq.submit(raw)
    finally:
        utxo.close()
        state.close()


@pytest.mark.timeout(300)
def test_the_check_tells_a_right_store_from_a_wrong_one(tmp_path: Path) -> None:
    chain = generate(3, 30, fan_blocks=1, seed=3)
    urls = fresh_stores("sqlite:///x", tmp_path, "t")
    _apply(chain.raws, urls)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UTXO_STORE_URL": urls["store"],
           "UTXO_STATE_URL": urls["state"], "UTXO_BLOB_URL": urls["blobs"]}
    assert check(chain, env, tmp_path) == {"tip": True, "muhash": True, "confirmed_set": True, "ok": True}
    other = generate(3, 30, fan_blocks=1, seed=4)  # same shape, other spends
    wrong = check(other, env, tmp_path)
    assert wrong["ok"] is False and not wrong["tip"] and not wrong["muhash"] and not wrong["confirmed_set"]


def _bench(*args: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "bench.scaleout", "--redis", f"{REDIS}/0", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_bench_scaleout_runs_the_users_path_and_reports_per_worker_count() -> None:
    out = _bench("--workers", "1,2", "--blocks", "8", "--txs-per-block", "30", "--fan-blocks", "1")
    assert out["bench"] == "scaleout" and out["flow"] == "blocks" and out["correct"] is True
    assert out["blocks"] == MATURITY + 1 + 8 and out["txs"] == (MATURITY + 1 + 8) + 9 * 30
    assert [r["workers"] for r in out["by_workers"]] == [1, 2]
    for row in out["by_workers"]:
        assert row["correct"] is True
        for field in ("tx_per_s", "cpu_s_per_1000_tx", "host_cores_busy", "peak_rss_mb", "speedup",
                      "flatness"):
            assert row[field] > 0, field
        assert len(row["quarters_tx_per_s"]) == 4 and min(row["quarters_tx_per_s"]) > 0
    assert out["by_workers"][0]["speedup"] == 1.0


@pytest.mark.timeout(300)
def test_bench_scaleout_mempool_flow_times_the_tx_and_block_phases() -> None:
    out = _bench("--workers", "2", "--flow", "mempool", "--blocks", "2", "--txs-per-block", "15",
                 "--fan-blocks", "1")
    assert out["flow"] == "mempool" and out["correct"] is True
    (row,) = out["by_workers"]
    assert row["tx_phase_tx_per_s"] > 0 and row["block_phase_tx_per_s"] > 0
    assert out["txs"] == 2 * 16  # the main blocks' transactions, coinbases included


def test_the_electrumx_stand_in_serves_the_chain_as_bitcoind_does() -> None:
    """The anchor's bitcoind stand-in (ElectrumX itself is not installed here): regtest's
    genesis at height 0, the chain above it, JSON-RPC batches, and bitcoind's "method not found"
    for anything else, counted."""
    import urllib.request

    from bench.chaingen import REGTEST_GENESIS
    from bench.electrumx import REGTEST_GENESIS_BLOCK, Daemon

    genesis = parse_block(REGTEST_GENESIS_BLOCK)
    assert genesis.hash == REGTEST_GENESIS and genesis.txs[0].is_coinbase
    chain = generate(1, 5, fan_blocks=1, seed=2)
    daemon = Daemon([REGTEST_GENESIS_BLOCK, *chain.raws])
    try:
        def rpc(body: object) -> object:
            req = urllib.request.Request(daemon.url.replace("user:pass@", ""), json.dumps(body).encode())
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.headers["Content-Type"] == "application/json"
                return json.loads(resp.read())

        assert rpc({"id": 1, "method": "getblockcount"})["result"] == chain.tip_height
        top = parse_block(chain.raws[-1]).hash[::-1].hex()
        hashes = rpc([{"id": h, "method": "getblockhash", "params": [h]} for h in (0, chain.tip_height)])
        assert [r["result"] for r in hashes] == [REGTEST_GENESIS[::-1].hex(), top]
        got = rpc([{"id": 7, "method": "getblock", "params": [top, False]}])[0]
        assert got["id"] == 7 and bytes.fromhex(got["result"]) == chain.raws[-1]
        bad = rpc({"id": 9, "method": "sendrawtransaction", "params": ["00"]})
        assert bad["result"] is None and bad["error"]["code"] == -32601
        assert daemon.unknown == {"sendrawtransaction": 1}
    finally:
        daemon.close()


def test_the_anchor_summary_says_why_it_is_missing() -> None:
    from bench.scaleout import anchor_summary

    assert "--flow blocks" in anchor_summary("/x", "mempool", [])["skipped"]
    assert "electrumx_server" in anchor_summary(None, "blocks", [])["skipped"]
    assert anchor_summary("/x", "blocks", [{"error": "it died"}]) == {"error": "it died"}
    runs = [{"tx_per_s": 5}, {"error": "x"}, {"tx_per_s": 9}]
    assert anchor_summary("/x", "blocks", runs) == {"tx_per_s": 9, "runs": runs}
