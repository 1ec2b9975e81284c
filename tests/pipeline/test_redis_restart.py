"""The broker restarted mid-run: real `utxo worker` processes, `utxo beat` and a private
`redis-server` (nothing on disk) that is SIGKILLed while blocks and mempool transactions are
queued, and started again on the same port. Every message it lost is sent again (the registry of
pending messages lives in the state store; workers/recovery/requeue.py), the chain ends complete and
equal to the model, every mempool transaction is in the store once, and `utxo wait` waits
across the restart instead of returning early."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chain import Tx, parse_block
from tests.pipeline.chains import Chain, confirmed_model, funding, outpoints, spend
from tests.pipeline.redis_server import RedisServer, broker_fixture  # noqa: F401  (the fixture)
from tests.pipeline.workers import Pipeline, until

FUNDS_OUTPUTS = 50  # one record each at UTXO_BATCH_SIZE=50


@pytest.fixture
def pipeline(tmp_path: Path, broker: RedisServer) -> Iterator[Pipeline]:
    p = Pipeline(tmp_path, broker.url)
    p.env["UTXO_REQUEUE_INTERVAL"] = "1"  # beat's scan: soon after the restart
    # not by age within the test: whatever is re-sent is re-sent because its broker run is gone
    p.env["UTXO_REQUEUE_AFTER"] = "1h"
    yield p
    p.stop(graceful=False)


def queued(pipeline: Pipeline) -> int:
    return int(pipeline.redis.llen("blocks")) + int(pipeline.redis.llen("txs"))


def wait_start(pipeline: Pipeline, timeout: float) -> subprocess.Popen[str]:
    """`utxo wait`, started and left running."""
    return subprocess.Popen([sys.executable, "-m", "workers.cli", "wait", "--timeout", str(timeout)],
                            env=pipeline.env, cwd=pipeline.tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_result(proc: subprocess.Popen[str], timeout: float) -> tuple[int, dict[str, object]]:
    out, err = proc.communicate(timeout=timeout)
    assert out.strip(), err
    return proc.returncode, json.loads(out)


def tip_height(pipeline: Pipeline) -> int:
    state = pipeline.open_state()
    try:
        tip = state.tip()
        return -1 if tip is None or tip.height is None else tip.height
    finally:
        state.close()


def chain_and_mempool(
    pipeline: Pipeline, n_blocks: int, n_txs: int, wide: bool = False
) -> tuple[Chain, list[Tx], list[Tx]]:
    """The pipeline seeded with funding outputs, a chain of `n_blocks` blocks of `n_txs` spends
    of them (not enqueued), and mempool transactions: ten with parents in the snapshot, five
    whose parents are in the last block (they wait for it) and one with a parent of each kind.
    `wide`: each block's last spend has 130 outputs and the mempool gains one of 120 (records
    of several pages at UTXO_BATCH_SIZE=50: two-phase creation). (chain, funds, mempool)."""
    funds = funding(-(-(n_blocks * n_txs + 20) // FUNDS_OUTPUTS), n_outputs=FUNDS_OUTPUTS)
    chain = pipeline.seed(funds)
    outs = [(f, v) for f in funds for v in range(FUNDS_OUTPUTS)]
    for b in range(n_blocks):
        txs = [spend(o) for o in outs[b * n_txs : (b + 1) * n_txs]]
        if wide:
            txs[-1] = spend(outs[(b + 1) * n_txs - 1], n_outputs=130)
        chain.add(txs)
    spare = outs[n_blocks * n_txs :]
    loose = [spend(o, n_outputs=2) for o in spare[:10]]  # parents in the snapshot
    kids = [spend((t, 0)) for t in chain.txs[-1][1:6]]  # parents in the last block: they wait
    mempool = loose + kids + [spend((loose[0], 1), (kids[0], 0))]
    if wide:
        mempool.append(spend((chain.txs[-2][-1], 7), n_outputs=120))
    return chain, funds, mempool


def check_complete(
    pipeline: Pipeline, chain: Chain, base: set[tuple[bytes, int]], mempool: list[Tx]
) -> None:
    """Every block applied once, the tip and the confirmed set as the model has them; every
    mempool transaction in the store, unmined, its spends in place; nothing left pending."""
    last = parse_block(chain.blocks[-1]).hash
    tip = pipeline.tip()
    assert (tip["height"], tip["hash"]) == (chain.height - 1, last[::-1].hex()), pipeline.logs()
    assert pipeline.state_counts() == {"applied": len(chain.blocks) + 1}  # and the snapshot's block
    model = confirmed_model(chain.txs, base)
    assert pipeline.confirmed() == model
    spent = {(i.prev_txid, i.prev_vout) for t in mempool for i in t.inputs}
    made = {(t.txid, v) for t in mempool for v in range(len(t.outputs))}
    store = pipeline.open_utxo()
    try:
        assert {(u.txid, u.vout) for u in store.iter_utxos(confirmed=False)} == (model | made) - spent
        for t in mempool:
            meta = store.get(t.txid)
            assert meta.unmined_since is not None and not meta.block_ids, meta
            assert not meta.conflicting and not meta.creating, meta
    finally:
        store.close()
    assert pipeline.pending() == set()


@pytest.mark.timeout(150)
def test_redis_killed_mid_run_loses_nothing(pipeline: Pipeline, broker: RedisServer) -> None:
    """Two workers and beat; a chain of blocks and mempool transactions (some waiting for
    parents the last blocks create) enqueued; Redis SIGKILLed once the first block is applied,
    with messages still queued, and started again. Beat's next scan re-sends what was lost."""
    n_blocks, n_txs = 12, 1500
    chain, funds, mempool = chain_and_mempool(pipeline, n_blocks, n_txs)

    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    pipeline.start_beat()
    # the transactions first (those whose parents are in the blocks wait and retry), so that the
    # kill lands while the blocks are being applied: applying them takes a few seconds
    pipeline.enqueue("tx", [t.raw for t in mempool])
    pipeline.enqueue("block", chain.blocks)
    waiter = wait_start(pipeline, 100)  # before the kill (it waits for what is pending now)
    lost_with = broker.run_id()
    first = chain.height - n_blocks
    until(lambda: tip_height(pipeline) >= first, 60, 0.01, "the first block applied")
    pending = pipeline.pending()
    broker.kill()
    assert tip_height(pipeline) < chain.height - 1, "the kill was meant to land mid-run"
    assert any(p.startswith("block:") for p in pending) and any(p.startswith("tx:") for p in pending)

    time.sleep(0.5)  # the workers and beat see the broker gone
    assert broker.start() != lost_with  # a new run: its queues start empty
    # the wait started before the kill returns 0 only once everything is done (checked below)
    code, out = wait_result(waiter, 130)
    assert (code, out) == (0, {"done": True, "pending": 0, "refused": 0}), pipeline.logs()
    check_complete(pipeline, chain, outpoints(funds), mempool)
    assert "lost with an earlier broker run" in pipeline.logs(), pipeline.logs()
    assert all(p.poll() is None for p in pipeline.workers), pipeline.logs()  # all lived through it


@pytest.mark.timeout(90)
def test_wait_waits_across_a_restart_and_a_starting_worker_resends(
    pipeline: Pipeline, broker: RedisServer
) -> None:
    """Blocks and transactions enqueued while no worker runs; Redis restarted, its queues gone:
    `utxo wait` keeps waiting (its registry is in the state store), and the first worker to
    start re-sends them all (no beat here), after which the wait returns 0."""
    funds = funding(4, n_outputs=2)
    chain = pipeline.seed(funds)
    for f in funds[:3]:
        t = spend((f, 0), n_outputs=2)
        chain.add([t, spend((t, 1), (f, 1))])
    mempool = [spend((funds[3], 0)), spend((funds[3], 1), n_outputs=3)]
    pipeline.enqueue("block", chain.blocks)
    pipeline.enqueue("tx", [t.raw for t in mempool])
    assert queued(pipeline) == len(chain.blocks) + 1  # (the txs: one message)
    waiter = wait_start(pipeline, 80)

    broker.kill()
    broker.start()
    assert queued(pipeline) == 0  # every message is gone with the old run
    time.sleep(1.0)
    assert waiter.poll() is None, "utxo wait returned although nothing was processed"
    r = pipeline.utxo("wait", "--timeout", "0.3")
    assert (r.returncode, json.loads(r.stdout)) == (1, {"done": False, "pending": 5, "refused": 0}), r.stderr

    pipeline.start_worker("w1")
    code, out = wait_result(waiter, 80)
    assert (code, out) == (0, {"done": True, "pending": 0, "refused": 0}), pipeline.logs()
    check_complete(pipeline, chain, outpoints(funds), mempool)
    # (the blocks a message each, the two txs in one)
    resent = "re-sent 5 pending id(s) in 4 message(s): 5 lost with an earlier broker run"
    assert resent in pipeline.log("w1"), pipeline.log("w1")


@pytest.mark.timeout(90)
def test_the_workers_resend_what_a_restart_lost_with_no_beat(pipeline: Pipeline, broker: RedisServer) -> None:
    """No `utxo beat`: a worker that was running when Redis lost its queues sends a re-sending
    scan every UTXO_REQUEUE_INTERVAL itself (its start-up scan came before the loss). Here it
    takes only `recovery`, so the re-sent blocks wait on the queue to be counted; a worker of
    `blocks` started after them applies them."""
    funds = funding(3, n_outputs=2)
    chain = pipeline.seed(funds)
    for f in funds:
        t = spend((f, 0), n_outputs=2)
        chain.add([t, spend((t, 1), (f, 1))])
    pipeline._start("r1", ["worker", "-n", "r1@test", "-Q", "recovery"], b"ready", "worker")
    time.sleep(1.5)  # its start-up scan has run: nothing was pending then
    pipeline.enqueue("block", chain.blocks)
    assert queued(pipeline) >= len(chain.blocks)  # (and the manager's message taking the chain up)
    broker.kill()  # every message is gone with the old run (the scan below says so: "lost with
    broker.start()  # an earlier broker run"; what is queued at once may be its re-sends already)
    # (the blocks are indexed by `utxo enqueue`: the manager may add a message that takes the
    # chain up, which nobody applies here)
    until(lambda: queued(pipeline) >= len(chain.blocks) and "re-sent 3 pending id(s) in 3 message(s): 3 lost "
          "with an earlier broker run" in pipeline.log("r1"), 20, why="the running worker's own scan")
    pipeline.start_worker("w1")
    pipeline.wait(60)
    tip = pipeline.tip()
    assert tip["height"] == chain.height - 1
    assert pipeline.confirmed() == confirmed_model(chain.txs, outpoints(funds))


@pytest.mark.timeout(150)
def test_with_workers_only_a_restart_loses_nothing_and_confirms_what_a_calm_run_does(
    pipeline: Pipeline, broker: RedisServer
) -> None:
    """No beat: only two `utxo worker` processes, whose recovery manager (one leads) re-sends
    what Redis lost when it was SIGKILLed mid-run and started again empty. The run completes,
    and the manager then marks confirmed exactly the mempool transactions the chain mines — the
    set a calm run gives, computed here from the chain — and leaves the rest pending."""
    pipeline.env.update({"UTXO_RECOVERY_TTL": "0", "UTXO_RECOVERY_SCAN_INTERVAL": "0.3",
                         "UTXO_RECOVERY_LEASE": "5"})
    n_blocks, n_txs = 8, 800
    funds = funding(-(-(n_blocks * n_txs + 12) // FUNDS_OUTPUTS), n_outputs=FUNDS_OUTPUTS)
    chain = pipeline.seed(funds)
    outs = [(f, v) for f in funds for v in range(FUNDS_OUTPUTS)]
    mempool = [spend(o, n_outputs=2) for o in outs[n_blocks * n_txs : n_blocks * n_txs + 12]]
    mined = mempool[:6]  # the last blocks mine these; the other six stay in the mempool
    for b in range(n_blocks):
        extra = mined[(b - n_blocks + 2) * 3 :][:3] if b >= n_blocks - 2 else []
        chain.add([spend(o) for o in outs[b * n_txs : (b + 1) * n_txs]] + extra)
    assert [t for txs in chain.txs for t in txs if t in mempool] == mined
    mempool += [spend((t, 0)) for t in chain.txs[-1][1:4]]  # parents in the last block: they wait

    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    pipeline.enqueue("tx", [t.raw for t in mempool])
    pipeline.enqueue("block", chain.blocks)
    waiter = wait_start(pipeline, 120)
    first = chain.height - n_blocks
    until(lambda: tip_height(pipeline) >= first, 60, 0.01, "the first block applied")
    pending = pipeline.pending()
    broker.kill()
    assert tip_height(pipeline) < chain.height - 1, "the kill was meant to land mid-run"
    assert any(p.startswith("tx:") for p in pending)  # (those waiting for the last block at least)
    time.sleep(0.5)
    broker.start()
    code, out = wait_result(waiter, 130)
    assert (code, out) == (0, {"done": True, "pending": 0, "refused": 0}), pipeline.logs()
    assert pipeline.confirmed() == confirmed_model(chain.txs, outpoints(funds))
    assert "lost with an earlier broker run" in pipeline.logs(), pipeline.logs()

    state = pipeline.open_state()
    try:
        def settled() -> bool:
            return state.recovery_summary(0)["states"].get("tx", {}).get("confirmed", 0) == len(mined)

        until(settled, 30, 0.2, "the manager confirming the mined transactions")
        statuses = {t.txid_hex: e.status for t in mempool if (e := state.recovery_entry(f"tx:{t.txid_hex}"))}
    finally:
        state.close()
    assert statuses == {t.txid_hex: "confirmed" if t in mined else "pending" for t in mempool}
    assert all(p.poll() is None for p in pipeline.workers), pipeline.logs()
