"""The broker through Redis Sentinel: a primary, a replica and three sentinels, real `utxo worker`
processes given only the sentinels (`sentinel://…?master_name=`). The primary is SIGKILLed
mid-run; the sentinels promote the replica, every process follows it, and whatever the replica
had not received (replication is asynchronous) is sent again from the pending registry: the
chain ends complete and equal to the model, every mempool transaction in the store once. And
the commands refuse a Sentinel URL that cannot work (exit 2, one line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline.chains import funding, outpoints, spend
from tests.pipeline.sentinel_server import MASTER, SentinelSet, sentinels_fixture  # noqa: F401
from tests.pipeline.test_redis_restart import (
    chain_and_mempool,
    check_complete,
    tip_height,
    wait_result,
    wait_start,
)
from tests.pipeline.workers import Pipeline, until
from workers.broker.runs import BrokerRun, BrokerUnreachable


def run_of(url: str) -> str | None:
    try:
        return BrokerRun(url).current(fresh=True)
    except BrokerUnreachable:
        return None


@pytest.fixture
def pipeline(tmp_path: Path, sentinels: SentinelSet) -> Iterator[Pipeline]:
    p = Pipeline(tmp_path, sentinels.url)
    p.env["UTXO_REQUEUE_INTERVAL"] = "1"  # the workers' re-sending scan: soon after the failover
    p.env["UTXO_REQUEUE_AFTER"] = "1h"  # re-sent because the broker's run changed, not by age
    yield p
    p.stop(graceful=False)


@pytest.mark.timeout(180)
def test_the_primary_killed_mid_run_loses_nothing(pipeline: Pipeline, sentinels: SentinelSet) -> None:
    n_blocks, n_txs = 10, 800
    chain, funds, mempool = chain_and_mempool(pipeline, n_blocks, n_txs)

    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    pipeline.enqueue("tx", [t.raw for t in mempool])
    pipeline.enqueue("block", chain.blocks)
    waiter = wait_start(pipeline, 150)
    run_before = BrokerRun(sentinels.url).current(fresh=True)
    until(lambda: tip_height(pipeline) >= chain.height - n_blocks, 60, 0.01, "the first block applied")
    sentinels.kill_primary()
    assert tip_height(pipeline) < chain.height - 1, "the kill was meant to land mid-run"
    sentinels.wait_promoted()
    # the replica's own run (asked as every process asks: the sentinels may still agree a moment)
    until(lambda: run_of(sentinels.url) not in (None, run_before), 30, why="the promoted replica answers")

    code, out = wait_result(waiter, 170)
    assert (code, out) == (0, {"done": True, "pending": 0, "refused": 0}), pipeline.logs()
    check_complete(pipeline, chain, outpoints(funds), mempool)
    assert "lost with an earlier broker run" in pipeline.logs(), pipeline.logs()
    assert all(p.poll() is None for p in pipeline.workers), pipeline.logs()  # all lived through it
    assert pipeline.redis.info("server")["tcp_port"] == sentinels.ports["replica"]


def test_a_sentinel_url_that_cannot_work_is_refused(pipeline: Pipeline, sentinels: SentinelSet) -> None:
    """No primary's name, a name no sentinel monitors, a part that is not a sentinel: exit 2 and
    one line naming UTXO_BROKER_URL, for enqueue and worker alike; the right URL enqueues."""
    s1 = sentinels.ports["s1"]
    funds = funding(1)
    pipeline.seed(funds)
    (pipeline.tmp / "tx.hex").write_text(spend((funds[0], 0)).raw.hex() + "\n")
    for url, said in (
        (f"sentinel://127.0.0.1:{s1}/0", "needs the primary's name"),
        (f"sentinel://127.0.0.1:{s1}/0?master_name=nobody", "monitor no primary named 'nobody'"),
        (f"sentinel://127.0.0.1:{s1}/0?master_name={MASTER};redis://127.0.0.1:1", "must be sentinel://"),
        (f"sentinel://127.0.0.1:{sentinels.ports['primary']}/0?master_name={MASTER}", "is no Redis Sentinel"),
    ):
        pipeline.env["UTXO_BROKER_URL"] = url
        for args in (["enqueue", "tx", "tx.hex"], ["worker", "-n", "x@test"]):
            r = pipeline.utxo(*args, timeout=30)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1, r.stderr
            assert lines[0].startswith("utxo: error: UTXO_BROKER_URL (sentinel://"), r.stderr
            assert said in lines[0], r.stderr
    pipeline.env["UTXO_BROKER_URL"] = f"sentinel://127.0.0.1:{s1}/0"  # `utxo status` says it, whole
    r = pipeline.utxo("status", "--json", timeout=30)
    assert "needs ?master_name" in json.loads(r.stdout)["errors"]["broker"], r.stdout + r.stderr
    pipeline.env["UTXO_BROKER_URL"] = sentinels.url
    r = pipeline.utxo("enqueue", "tx", "tx.hex")
    assert r.returncode == 0 and pipeline.redis.llen("txs") == 1, r.stderr
