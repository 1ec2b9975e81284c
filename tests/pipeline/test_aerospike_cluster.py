"""The UTXO store on an Aerospike Community Edition cluster of three nodes (replication factor 2,
tests/aerospike_cluster.py), a node SIGKILLed mid-run while two real workers apply a chain with
multi-record transactions (two-phase creation: UTXO_BATCH_SIZE=50) and mempool transactions. The
client's calls on the lost node fail or time out and are retried (by the client, by the task),
the partitions it led are taken over by their replicas and migrated: the chain ends complete and
equal to the model, during the migration and after it. Runs where AEROSPIKE_ASD names a server
binary; skipped otherwise."""

from __future__ import annotations

import pytest

from tests.aerospike_cluster import Cluster, cluster_fixture, needs_asd  # noqa: F401  (the fixture)
from tests.pipeline.chains import confirmed_model, outpoints
from tests.pipeline.test_redis_restart import (
    chain_and_mempool,
    check_complete,
    tip_height,
    wait_result,
    wait_start,
)
from tests.pipeline.workers import Pipeline, pipeline_fixture, until  # noqa: F401  (the fixture)

pytestmark = needs_asd


@pytest.mark.timeout(300)
def test_a_node_lost_mid_run_changes_no_answer(pipeline: Pipeline, cluster: Cluster) -> None:
    pipeline.use_aerospike(cluster.url())
    n_blocks, n_txs = 12, 300
    chain, funds, mempool = chain_and_mempool(pipeline, n_blocks, n_txs, wide=True)
    wide = mempool[-1]  # a multi-record mempool tx (and each block's last tx: three records)

    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    pipeline.enqueue("tx", [t.raw for t in mempool])
    pipeline.enqueue("block", chain.blocks)
    waiter = wait_start(pipeline, 250)
    first = chain.height - n_blocks
    until(lambda: tip_height(pipeline) >= first + 2, 120, 0.01, "the first blocks applied")
    at = tip_height(pipeline)
    cluster.kill(1)
    assert at < chain.height - 1, "the kill was meant to land mid-run"
    code, out = wait_result(waiter, 270)
    assert (code, out) == (0, {"done": True, "pending": 0, "refused": 0}), pipeline.logs() + cluster.logs()
    check_complete(pipeline, chain, outpoints(funds), mempool)  # (the migration may still run)
    cluster.until_size(2)
    until(lambda: cluster.migrations_left() == 0, 120, 0.2, "the migrations done")
    assert pipeline.confirmed() == confirmed_model(chain.txs, outpoints(funds))
    store = pipeline.open_utxo()
    try:  # the multi-record ones whole: every output readable, none left creating
        for t in [*(b[-1] for b in chain.txs[-n_blocks:]), wide]:
            meta = store.get(t.txid)
            assert not meta.creating, meta
            got = store.get_outputs([(t.txid, v) for v in range(len(t.outputs))])
            assert all(o is not None for o in got.values()), t.txid_hex
    finally:
        store.close()
    assert all(p.poll() is None for p in pipeline.workers), pipeline.logs()
