"""The pruner end to end: real `utxo worker` processes run the jobs that blocks and `utxo prune`
request (queue `prune`), with retention 10. What the store keeps is checked against the exact set
of records worked out here from the chain (a record stays while it has an unspent output, or
until its last spend is a retention deep), and the confirmed set against the independent model.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence

import boto3
import pytest

from chain import Tx
from stores.blob import open_blob_store
from tests.aerospike_server import needs_aerospike
from tests.pipeline.chains import SNAPSHOT_HEIGHT, Chain, confirmed_model, funding, outpoints, spend
from tests.pipeline.workers import ROOT, Pipeline, faults, pipeline_fixture, until  # noqa: F401  (the fixture)
from workers.chainstate.sequencer import Sequencer

RET = 10
BACKENDS = ["sqlite", "postgresql", pytest.param("aerospike", marks=needs_aerospike)]


def generate(funds: Sequence[Tx], chain: Chain, blocks: int, per_block: int, seed: int) -> None:
    """Blocks whose transactions spend 1-2 outputs of earlier blocks (or of the snapshot) into 1-2
    new outputs, chosen at random: most records end up all spent at some height."""
    rng = random.Random(seed)
    pool = sorted(outpoints(funds))
    txs = {t.txid: t for t in funds}
    for _ in range(blocks):
        new: list[Tx] = []
        for _ in range(per_block):
            if not pool:
                break
            ins = [pool.pop(rng.randrange(len(pool))) for _ in range(min(len(pool), rng.choice((1, 1, 2))))]
            t = spend(*((txs[t], v) for t, v in ins), n_outputs=rng.choice((1, 2)))
            new.append(t)
        chain.add(new)
        for t in new:
            txs[t.txid] = t
            pool.extend((t.txid, v) for v in range(len(t.outputs)))


def kept(funds: Sequence[Tx], chain: Chain, pruned_at: int) -> set[bytes]:
    """The records a store of `chain` holds once a run at `pruned_at` has completed: a record is
    due a retention after the later of its mining and the spend of its last output."""
    made: dict[bytes, int] = {t.txid: SNAPSHOT_HEIGHT for t in funds}
    outs: dict[bytes, int] = {t.txid: len(t.outputs) for t in funds}
    last: dict[bytes, int] = {}
    spent: dict[bytes, int] = {}
    for h, txs in enumerate(chain.txs, start=SNAPSHOT_HEIGHT + 1):
        for t in txs:
            made[t.txid], outs[t.txid] = h, len(t.outputs)
            for i in [] if t.is_coinbase else t.inputs:
                spent[i.prev_txid] = spent.get(i.prev_txid, 0) + 1
                last[i.prev_txid] = h
    return {
        t for t in made
        if spent.get(t, 0) < outs[t] or max(made[t], last[t]) + RET > pruned_at
    }  # fmt: skip


def stored(pipeline: Pipeline, txids: Sequence[bytes]) -> set[bytes]:
    store = pipeline.open_utxo()
    try:
        return store.existing(list(txids))
    finally:
        store.close()


def jobs(pipeline: Pipeline) -> list[dict[str, object]]:
    r = pipeline.utxo("prune", "--jobs", "--limit", "1000")
    assert r.returncode == 0, r.stderr
    out: list[dict[str, object]] = json.loads(r.stdout)["jobs"]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chain_through_the_pipeline_with_retention_10_keeps_only_what_may_be_needed(
    pipeline: Pipeline, request: pytest.FixtureRequest, backend: str
) -> None:
    pipeline.env["UTXO_BLOCK_HEIGHT_RETENTION"] = str(RET)
    if backend == "postgresql":  # concurrent writers: a run's chunks are shared with helper tasks
        pipeline.use_postgres(request.getfixturevalue("pg_database"))
        pipeline.env["UTXO_PRUNER_CHUNK_SIZE"] = "20"
    if backend == "aerospike":  # concurrent writers too
        pipeline.use_aerospike(request.getfixturevalue("aerospike_url"))
        pipeline.env["UTXO_PRUNER_CHUNK_SIZE"] = "20"
    funds = funding(40, n_outputs=2)
    chain = pipeline.seed(funds)
    generate(funds, chain, blocks=40, per_block=25, seed=11)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    pipeline.enqueue("block", chain.blocks)
    pipeline.wait(180)
    tip = pipeline.tip()["height"]
    assert tip == SNAPSHOT_HEIGHT + 40
    r = pipeline.utxo("prune", "--wait", "--timeout", "120", timeout=150)  # at the tip (the last
    assert r.returncode == 0, r.stdout + r.stderr + pipeline.logs()  # block's request may be running)
    job = json.loads(r.stdout)
    assert job["status"] == "completed" and job["height"] == tip
    everything = [t.txid for t in funds] + [t.txid for txs in chain.txs for t in txs]
    want = kept(funds, chain, tip)
    assert stored(pipeline, everything) == want
    assert len(want) < 0.6 * len(everything)  # bounded: most records went
    assert pipeline.confirmed() == confirmed_model(chain.txs, outpoints(funds))
    # the runs were the blocks' own requests: several, one at a time, all completed or replaced
    history = jobs(pipeline)
    ran = [j for j in history if j["status"] == "completed"]
    assert len(ran) >= 2 and all(j["status"] in ("completed", "cancelled") for j in history), history
    logs = pipeline.logs()
    assert "Traceback" not in logs
    if backend == "postgresql":  # some run had several chunks: helpers ran some of them
        assert any(j["figures"]["delete"]["chunks"] > 1 for j in ran), ran  # type: ignore[index]
        assert "utxoflow.prune.chunk" in logs and "succeeded" in logs


def apply_here(pipeline: Pipeline, funds: Sequence[Tx], blocks: int, per_block: int) -> Chain:
    """Seed and apply a chain in this process (no pruner: nothing requests a run yet)."""
    chain = pipeline.seed(funds)
    generate(funds, chain, blocks=blocks, per_block=per_block, seed=5)
    from stores.utxo import open_utxo_store

    env = pipeline.env
    utxo = open_utxo_store(env["UTXO_STORE_URL"], retention=RET, blob_url=env["UTXO_BLOB_URL"],
                           batch_size=int(env["UTXO_BATCH_SIZE"]),
                           externalize_all=env.get("UTXO_EXTERNALIZE_ALL") == "true")
    state = pipeline.open_state()
    try:
        seq = Sequencer(utxo, state, open_blob_store(pipeline.env["UTXO_BLOB_URL"]))
        for raw in chain.blocks:
            seq.submit(raw)
    finally:
        utxo.close()
        state.close()
    return chain


REQUESTER = """
import json, sys
from stores.state import open_state_store
from workers.runtime.app import app
from workers.pruning.pruner import RUN_TASK
state = open_state_store(sys.argv[1])
for h in json.loads(sys.argv[2]):
    r = state.prune_request(h, 600.0)
    if r.start:
        app.send_task(RUN_TASK, args=[])
    print(json.dumps([h, r.job.id]), flush=True)
state.close()
"""


@pytest.mark.timeout(300)
def test_racing_requests_from_two_processes_run_one_job_at_a_time_at_the_latest_heights(
    pipeline: Pipeline,
) -> None:
    pipeline.env.update(UTXO_BLOCK_HEIGHT_RETENTION=str(RET), UTXO_PRUNER_CHUNK_SIZE="20")
    funds = funding(40, n_outputs=2)
    chain = apply_here(pipeline, funds, blocks=50, per_block=25)
    tip = SNAPSHOT_HEIGHT + 50
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    heights = list(range(tip - 49, tip + 1))
    random.Random(3).shuffle(heights)
    procs = [
        subprocess.Popen([sys.executable, "-c", REQUESTER, pipeline.env["UTXO_STATE_URL"], json.dumps(part)],
                         env={**pipeline.env, "PYTHONPATH": str(ROOT)}, cwd=pipeline.tmp,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for part in (heights[:25], heights[25:])
    ]
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        answers += [tuple(json.loads(line)) for line in out.splitlines()]
    assert len(answers) == 50

    def settled() -> list[dict[str, object]] | None:
        h = jobs(pipeline)
        return None if any(j["status"] in ("pending", "running") for j in h) else h

    history = until(settled, 120, poll=0.5, why="prune jobs to finish")
    by_id = {j["id"]: j for j in history}
    ran = sorted((j for j in history if j["status"] == "completed"), key=lambda j: j["id"])  # type: ignore[arg-type, return-value]
    # never two at once
    spans = sorted((j["started_at"], j["ended_at"]) for j in ran)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans  # type: ignore[operator]
    # one run per distinct height, each above the last: the latest waiting height each time
    assert [j["height"] for j in ran] == sorted({j["height"] for j in ran}), ran
    assert ran[-1]["height"] == tip
    # every job is a run or a request replaced by a higher one; every request got a job at least
    # as high as it asked (its own, a waiting one, or a run that had already covered it)
    for j in history:
        assert j["status"] in ("completed", "cancelled"), j
        if j["status"] == "cancelled":
            assert str(j["error"]).startswith("replaced by a request at height"), j
            assert int(str(j["error"]).rsplit(" ", 1)[1]) > j["height"]  # type: ignore[operator]
    for h, job_id in answers:
        assert by_id[job_id]["height"] >= h  # type: ignore[operator]
    assert len({job_id for _h, job_id in answers}) == len(history)  # every job answered a request
    everything = [t.txid for t in funds] + [t.txid for txs in chain.txs for t in txs]
    assert stored(pipeline, everything) == kept(funds, chain, tip)
    assert pipeline.confirmed() == confirmed_model(chain.txs, outpoints(funds))


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_run_leaves_the_job_to_the_next_run(pipeline: Pipeline, s3_endpoint: str) -> None:
    # every tx external, in S3 (a run removes a blob per record), and a wait after each unit: a
    # run long enough to kill in the middle on any machine (without the wait, CI runs here
    # finished the job before the kill)
    bucket = f"prune-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    pipeline.env.update(
        UTXO_BLOCK_HEIGHT_RETENTION=str(RET), UTXO_PRUNER_CHUNK_SIZE="2", UTXO_EXTERNALIZE_ALL="true",
        **faults(prune_delay=0.02),
        UTXO_BLOB_URL=f"s3://{bucket}/b?endpoint_url={s3_endpoint}&region=us-east-1",
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
    )
    funds = funding(40, n_outputs=2)
    chain = apply_here(pipeline, funds, blocks=35, per_block=20)
    tip = SNAPSHOT_HEIGHT + 35
    everything = [t.txid for t in funds] + [t.txid for txs in chain.txs for t in txs]
    before = stored(pipeline, everything)
    pipeline.start_worker("w1")
    r = pipeline.utxo("prune", "--height", str(tip))
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)

    state = pipeline.open_state()
    try:
        job = until(lambda: next((j for j in state.prune_jobs() if j.status == "running"), None), 60,
                    why="the run to start: " + json.dumps(jobs(pipeline)) + pipeline.logs())
    finally:
        state.close()
    until(lambda: stored(pipeline, everything) != before, 60, poll=0.02, why="the run to delete")
    pid = int(str(job.holder).split(":")[1])
    os.kill(pid, signal.SIGKILL)  # the pool child running the job, mid-run
    # the task comes back (acks late, rejected when its worker is lost): the next run fails
    # the dead job and runs its height again
    r = pipeline.utxo("prune", "--height", str(tip), "--wait", "--timeout", "120", timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr + pipeline.logs()
    history = {j["id"]: j for j in jobs(pipeline)}
    dead = history[first["id"]]
    assert dead["status"] == "failed" and "stopped renewing" in str(dead["error"]), dead
    done = [j for j in history.values() if j["status"] == "completed"]
    assert [j["height"] for j in done] == [tip]
    after = stored(pipeline, everything)
    assert after == kept(funds, chain, tip) and after < before  # nothing gone that should stay
    assert pipeline.confirmed() == confirmed_model(chain.txs, outpoints(funds))


@pytest.mark.timeout(180)
def test_utxo_prune_requests_waits_and_lists_and_refuses_bad_usage(pipeline: Pipeline) -> None:
    r = pipeline.utxo("prune", "--jobs")  # no state store yet: a reader never creates one
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "state store" in r.stderr
    for args in (["--jobs", "--height", "3"], ["--height", "x"], ["--height", "-1"], ["--jobs", "--wait"]):
        r = pipeline.utxo("prune", *args)
        assert r.returncode == 2 and r.stdout == "", args
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    pipeline.env["UTXO_BLOCK_HEIGHT_RETENTION"] = str(RET)
    funds = funding(10, n_outputs=2)
    chain = apply_here(pipeline, funds, blocks=15, per_block=10)
    tip = SNAPSHOT_HEIGHT + 15
    r = pipeline.utxo("prune")  # at the tip; no worker yet: the job waits in the slot
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert (job["height"], job["status"]) == (tip, "pending")
    r = pipeline.utxo("prune", "--jobs")
    status = json.loads(r.stdout)
    assert status["pending"]["id"] == job["id"]
    assert status["running"] is None and status["done_height"] is None
    r = pipeline.utxo("prune", "--height", str(tip - 2), "--wait", "--timeout", "0.5")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert json.loads(r.stdout)["id"] == job["id"]  # answered by the waiting, higher job
    pipeline.start_worker("w1")  # takes the run task that waited on the queue
    r = pipeline.utxo("prune", "--height", str(tip - 2), "--wait", "--timeout", "60", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr + pipeline.logs()
    done = json.loads(r.stdout)
    assert done["status"] == "completed" and done["height"] == tip
    assert done["figures"]["delete"]["deleted"] > 0
    everything = [t.txid for t in funds] + [t.txid for txs in chain.txs for t in txs]
    assert stored(pipeline, everything) == kept(funds, chain, tip)
    r = pipeline.utxo("prune", "--height", str(tip - 5))  # at or below what was pruned: at once
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == done["id"]
