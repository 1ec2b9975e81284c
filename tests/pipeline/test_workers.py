"""End to end: real `utxo worker` processes on a real Redis apply enqueued chains; the result
is compared with the independent model of tests/pipeline/chains.py."""

from __future__ import annotations

import pytest
import redis

from stores.state import open_state_store
from tests.pipeline.chains import Chain, confirmed_model, spend
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (the fixture)


@pytest.mark.timeout(240)
def test_two_workers_apply_a_chain_with_a_multi_record_tx(pipeline: Pipeline) -> None:
    c = Chain()
    for _ in range(101):
        c.add()
    big = spend((c.txs[0][0], 0), n_outputs=120)  # three records at 50 outputs each
    c.add([big, spend((big, 0), (big, 119))])  # parent and child in one block
    c.add([spend((big, 60))])
    (pipeline.tmp / "chain.hex").write_text("\n".join(b.hex() for b in c.blocks) + "\n")
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    r = pipeline.utxo("enqueue", "block", "chain.hex")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(c.blocks)
    r = pipeline.utxo("wait", "--timeout", "180", timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    tip = pipeline.utxo("tip")
    assert tip.returncode == 0 and f'"height": {len(c.blocks)}' in tip.stdout, tip.stdout
    assert pipeline.confirmed() == confirmed_model(c.txs)
    state = open_state_store(pipeline.env["UTXO_STATE_URL"])
    try:
        assert state.counts() == {"applied": len(c.blocks)}
    finally:
        state.close()
    logs = (pipeline.tmp / "w1.log").read_text() + (pipeline.tmp / "w2.log").read_text()
    assert "utxoflow.block.arrived" in logs and "Traceback" not in logs


def test_enqueue_refuses_bad_bytes_and_enqueues_nothing(pipeline: Pipeline) -> None:
    c = Chain()
    c.add()
    (pipeline.tmp / "good.hex").write_text(c.blocks[0].hex() + "\n")
    (pipeline.tmp / "bad.hex").write_text(c.blocks[0][:-3].hex() + "\n")
    r = pipeline.utxo("enqueue", "block", "good.hex", "bad.hex")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "bad.hex" in r.stderr
    assert redis.Redis.from_url(pipeline.env["UTXO_BROKER_URL"]).scard("utxoflow:pending") == 0
