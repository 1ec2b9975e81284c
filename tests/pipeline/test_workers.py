"""End to end: real `utxo worker` processes on a real Redis apply enqueued chains; the result
is compared with the independent model of tests/pipeline/chains.py."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from chain import parse_block
from stores.state import open_state_store
from tests.pipeline.chains import Chain, confirmed_model, funding, outpoints, spend
from tests.pipeline.workers import Pipeline, any_pipeline_fixture, pipeline_fixture  # noqa: F401  (fixtures)


@pytest.mark.timeout(240)
def test_two_workers_apply_a_chain_with_a_multi_record_tx(any_pipeline: Pipeline) -> None:
    pipeline = any_pipeline
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
    # each worker (one pool process) parsed each block once at most: no polling, none dropped
    per_worker = [Counter(re.findall(r"parsed block ([0-9a-f]{64})", pipeline.log(w))) for w in ("w1", "w2")]
    assert all(n == 1 for parsed in per_worker for n in parsed.values()), per_worker
    assert set().union(*per_worker) == {parse_block(b).hash_hex for b in c.blocks}


def test_enqueue_refuses_bad_bytes_and_enqueues_nothing(pipeline: Pipeline) -> None:
    c = Chain()
    c.add()
    (pipeline.tmp / "good.hex").write_text(c.blocks[0].hex() + "\n")
    (pipeline.tmp / "bad.hex").write_text(c.blocks[0][:-3].hex() + "\n")
    r = pipeline.utxo("enqueue", "block", "good.hex", "bad.hex")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "bad.hex" in r.stderr
    assert pipeline.pending() == set()


@pytest.mark.timeout(240)
def test_a_block_s_phases_are_shared_by_the_workers(pipeline: Pipeline) -> None:
    """Blocks of hundreds of txs in units of 7 (the Pipeline's setting): the coordinator posts
    each phase's units and the other worker's `utxoflow.chunk.*` tasks run some of them;
    a multi-record tx's pages are units too. The result is the model's. Blocks of 500 txs: a
    helper's first task opens its stores (~0.1 s), and blocks of 200 were measured done before
    any helper came, half the time."""
    funds = funding(3, n_outputs=400)
    base = outpoints(funds)
    chain = pipeline.seed(funds)
    for f in funds:
        txs = [spend((f, v)) for v in range(400)]
        txs += [spend((t, 0)) for t in txs[:100]]  # children in the same block as their parents
        chain.add(txs)
    big = spend((chain.txs[-1][-1], 0), n_outputs=170)  # four records at 50 outputs each
    chain.add([big, *[spend((big, v)) for v in range(0, 170, 10)]])
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    pipeline.enqueue("block", chain.blocks)
    pipeline.wait()
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)
    logs = pipeline.logs()
    done = r"utxoflow\.chunk\.\w+\[[^\]]+\] succeeded in [^:]+: .*'units': (\d+)"
    helped = [int(n) for n in re.findall(done, logs)]
    assert helped and sum(helped) > 0, logs[-3000:]  # some units ran in the worker that did not coordinate
    assert "Traceback" not in logs
