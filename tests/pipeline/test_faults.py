"""Faults under real `utxo worker` processes on a real Redis: a worker's pool child or a whole
worker killed (SIGKILL) in the middle of applying a block, and messages on the `blocks` queue
that no task can run. The chain still ends complete and equal to the model, and `utxo wait`
returns 0."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
import pytest

from chain import Tx, parse_block
from tests.conftest import PG_ADMIN
from tests.pipeline.chains import Chain, confirmed_model, funding, outpoints, spend
from tests.pipeline.workers import Pipeline, children, pipeline_fixture, until  # noqa: F401  (fixture)
from workers.broker.kombu_fix import DEAD_LETTERS, DEAD_LETTERS_TOTAL
from workers.chainstate.batch import APPLYING, applying_blocks
from workers.chainstate.chainlease import LEASE

FUNDS_OUTPUTS = 50  # one record each at UTXO_BATCH_SIZE=50


def big_chain(pipeline: Pipeline, n_blocks: int, n_txs: int) -> tuple[Chain, set[tuple[bytes, int]]]:
    """A seeded store and `n_blocks` blocks of `n_txs` one-input transactions each (spending
    snapshot outputs): large enough that applying one takes a few tenths of a second, so a kill
    lands inside it. The chain and the snapshot's outpoints."""
    funds = funding(-(-n_blocks * n_txs // FUNDS_OUTPUTS), n_outputs=FUNDS_OUTPUTS)
    chain = pipeline.seed(funds)
    outs: list[tuple[Tx, int]] = [(f, v) for f in funds for v in range(FUNDS_OUTPUTS)]
    for b in range(n_blocks):
        chain.add([spend(o) for o in outs[b * n_txs : (b + 1) * n_txs]])
    return chain, outpoints(funds)


def applying_pid(pipeline: Pipeline, block: bytes | None = None, timeout: float = 30) -> tuple[int, str]:
    """Poll the state store until some worker's pool child starts applying a block (`block`,
    given its raw bytes, or any): the `applying` mark is seen to change to it, so the block has
    only just begun. (That child's pid, the block's hash as the mark stores it.)"""
    want = None if block is None else parse_block(block).hash.hex()
    state = pipeline.open_state()
    seen: list[str | None] = []

    def look() -> tuple[int, str] | None:
        marks = applying_blocks(state)  # (the last: the block being applied now)
        h = marks[-1].hex() if marks else None
        holder = state.lease_holder(LEASE)
        fresh = h is not None and seen and seen[-1] != h and want in (None, h)
        seen.append(h)
        if not fresh or holder is None:
            return None
        assert h is not None
        return int(holder.split(":")[1]), h

    try:
        found: tuple[int, str] = until(look, timeout, poll=0.005, why="a worker applying a block")
        return found
    finally:
        state.close()


def owner(pipeline: Pipeline, child: int) -> int:
    """Which started worker (its index) `child` is the pool child of."""
    for i, p in enumerate(pipeline.workers):
        if child in children(p.pid):
            return i
    raise AssertionError(f"pid {child} is not a pool child of a started worker")


def display(h: str) -> str:
    """A block hash as the `applying` mark stores it (internal byte order) → as logs show it."""
    return bytes.fromhex(h)[::-1].hex()


def check_complete(
    pipeline: Pipeline, chain: Chain, base: set[tuple[bytes, int]], upto: int | None = None
) -> None:
    """`utxo wait` returns 0, and the chain's first `upto` blocks (all) are applied: the tip,
    the confirmed set (against the model), every block applied, no block half applied."""
    pipeline.wait(60)
    n = len(chain.blocks) if upto is None else upto
    last = parse_block(chain.blocks[n - 1]).hash
    tip = pipeline.tip()
    assert (tip["height"], tip["hash"]) == (chain.height - 1 - len(chain.blocks) + n, last[::-1].hex()), (
        pipeline.logs()
    )
    assert pipeline.confirmed() == confirmed_model(chain.txs[:n], base)
    assert pipeline.state_counts() == {"applied": n + 1}  # and the snapshot's block
    state = pipeline.open_state()
    try:
        assert state.get_meta(APPLYING) is None
    finally:
        state.close()


@pytest.mark.timeout(120)
def test_pool_child_killed_mid_block(pipeline: Pipeline) -> None:
    """The pool child applying a block dies (SIGKILL): its message is redelivered (acks late,
    rejected on worker lost), the next holder of the chain takes the dead child's lease at once,
    takes back the half-applied block and applies the chain to its end."""
    chain, base = big_chain(pipeline, 4, 10_000)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    enqueue = pipeline.enqueue_start("block", chain.blocks)
    child, h = applying_pid(pipeline)
    victim = owner(pipeline, child)
    time.sleep(0.05)  # well inside the block (applying one takes ~0.3 s)
    os.kill(child, signal.SIGKILL)
    enqueue.communicate(timeout=60)
    assert enqueue.returncode == 0
    check_complete(pipeline, chain, base)
    logs = pipeline.logs()
    assert f"taking back block {display(h)}, left half applied" in logs, logs
    assert "taking over the chain lease" in logs, logs
    main = pipeline.workers[victim]
    assert main.poll() is None, "the worker whose child was killed must live on"
    # the dead child is reaped (the pool notices within a few seconds) and replaced
    until(lambda: children(main.pid) and child not in children(main.pid), 20, 0.1, "a replacement child")


def kill_worker_mid_block(pipeline: Pipeline, chain: Chain, at: int) -> str:
    """With one worker w1 running, enqueue the chain and SIGKILL w1 whole (main process and pool
    child: its process group) once it has begun to apply block `at` (0-based). With one worker
    and prefetch 1, the message of that block is the only one it holds: the later blocks'
    messages wait on the queue. The hash of the block, as the `applying` mark stores it."""
    w1 = pipeline.start_worker("w1")
    enqueue = pipeline.enqueue_start("block", chain.blocks)
    child, h = applying_pid(pipeline, chain.blocks[at])
    assert child in children(w1.pid)
    time.sleep(0.05)  # well inside the block (applying one takes ~0.3 s)
    os.killpg(w1.pid, signal.SIGKILL)
    w1.wait()
    enqueue.communicate(timeout=60)
    assert enqueue.returncode == 0
    state = pipeline.open_state()
    try:
        marks = [m.hex() for m in applying_blocks(state)]
        assert marks[-1:] == [h], "the kill was meant to land inside the block"
        assert (undo := state.get_undo(bytes.fromhex(h))) is not None and undo["state"] == "applying"
    finally:
        state.close()
    return h


@pytest.mark.timeout(120)
def test_whole_worker_killed_mid_block(pipeline: Pipeline) -> None:
    """A whole worker dies mid-block: the message it held is lost with it (Redis gives it back
    only after the visibility timeout, an hour). Another worker, taking the next block's
    message, takes over the chain lease of the dead process at once, takes back the half-applied
    block and finishes the chain; `utxo wait` counts the lost message's block as settled. The
    worker started again works on with the other."""
    chain, base = big_chain(pipeline, 4, 10_000)
    h = kill_worker_mid_block(pipeline, chain, 1)
    pipeline.start_worker("w2")
    check_complete(pipeline, chain, base)
    log = pipeline.log("w2")
    assert "taking over the chain lease of" in log and "a process that is gone" in log, log
    assert f"taking back block {display(h)}, left half applied" in log, log

    # the dead worker started again, and more blocks: both apply them
    more = spend((chain.txs[1][1], 0), n_outputs=3)
    chain.add([more])
    chain.add([spend((more, 0), (more, 2))])
    pipeline.start_worker("w1")
    pipeline.enqueue("block", chain.blocks[-2:])
    check_complete(pipeline, chain, base)
    assert all(p.poll() is None for p in pipeline.workers[1:])


@pytest.mark.timeout(120)
def test_wait_covers_orphans_applied_after_their_parent(pipeline: Pipeline) -> None:
    """Blocks enqueued before their parent are orphans (their messages done at once); the
    parent's task applies them all. `utxo wait` returns when that task is done — not as soon as
    the parent block itself is applied (regression: `utxo wait` took an applied block's id as
    settled while the rest of the chain was still being applied)."""
    chain, base = big_chain(pipeline, 4, 10_000)
    pipeline.start_worker("w1")
    pipeline.enqueue("block", chain.blocks[1:])
    pipeline.wait(30)
    assert pipeline.state_counts() == {"applied": 1, "orphan": 3}
    pipeline.enqueue("block", chain.blocks[:1])
    check_complete(pipeline, chain, base)


@pytest.mark.timeout(60)
def test_last_block_of_a_killed_worker_is_applied_after_a_restart(pipeline: Pipeline) -> None:
    chain, base = big_chain(pipeline, 2, 10_000)
    kill_worker_mid_block(pipeline, chain, len(chain.blocks) - 1)
    pipeline.start_worker("w2")
    r = pipeline.utxo("wait", "--timeout", "3", timeout=40)
    assert r.returncode == 0, r.stdout + r.stderr
    check_complete(pipeline, chain, base)


@pytest.mark.timeout(180)
def test_a_worker_applying_a_long_chain_stops_on_sigterm(pipeline: Pipeline) -> None:
    """One task would apply a whole chain of orphans once their parent arrives; told to stop
    (SIGTERM: Celery's warm shutdown waits for the running task) the worker stops mid-chain,
    after its task's budget (UTXO_BLOCK_TASK_BUDGET) and the block in hand, handing the rest on
    as a message of its own; the next worker applies the rest."""
    chain, base = big_chain(pipeline, 20, 2_500)
    pipeline.env["UTXO_BLOCK_TASK_BUDGET"] = "0.5"
    w1 = pipeline.start_worker("w1")
    pipeline.enqueue("block", chain.blocks[1:])
    pipeline.wait()
    assert pipeline.state_counts() == {"applied": 1, "orphan": 19}
    enqueue = pipeline.enqueue_start("block", chain.blocks[:1])
    applying_pid(pipeline)
    w1.send_signal(signal.SIGTERM)
    w1.wait(timeout=60)  # (the whole chain would take several budgets)
    enqueue.communicate(timeout=60)
    assert w1.returncode == 0, pipeline.log("w1")
    counts = pipeline.state_counts()
    assert 1 < counts["applied"] < 21 and counts["applied"] + counts["pending"] == 21, counts  # mid-chain
    assert "hands the rest of the chain on" in pipeline.log("w1"), pipeline.log("w1")
    pipeline.start_worker("w2")
    check_complete(pipeline, chain, base)


# -- messages no task can run ------------------------------------------------------------------


def small_chain(pipeline: Pipeline, n_blocks: int = 3) -> tuple[Chain, set[tuple[bytes, int]]]:
    """A seeded store and `n_blocks` small blocks, each with a parent and child in it."""
    funds = funding(n_blocks, n_outputs=2)
    chain = pipeline.seed(funds)
    for f in funds:
        t = spend((f, 0), n_outputs=2)
        chain.add([t, spend((t, 1), (f, 1))])
    return chain, outpoints(funds)


GARBAGE = b"not json at all"
NO_BLOCK = "00" * 32  # a hash no stored block has


def send(pipeline: Pipeline, task: str, *args: str) -> None:
    """Send a task message straight to the pipeline's broker (no registry entry, no blob), as a
    client other than `utxo enqueue` could."""
    code = f"from workers.runtime.app import app; app.send_task({task!r}, args={list(args)!r})"
    subprocess.run([sys.executable, "-c", code], env=pipeline.env, cwd=pipeline.tmp, check=True, timeout=60)


@pytest.mark.timeout(120)
def test_messages_no_task_can_run_do_not_block_the_blocks_queue(pipeline: Pipeline) -> None:
    """A task name no worker knows and a block task naming no stored block, on the `blocks`
    queue ahead of a chain: the chain is applied all the same and both workers live on. Then raw
    garbage (not JSON) ahead of more blocks: they are applied all the same."""
    chain, base = small_chain(pipeline, 4)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    send(pipeline, "utxoflow.block.no_such_task", NO_BLOCK, "block:nope")
    send(pipeline, "utxoflow.block.arrived", NO_BLOCK, "block:x")
    pipeline.enqueue("block", chain.blocks[:2])
    check_complete(pipeline, chain, base, upto=2)
    assert all(p.poll() is None for p in pipeline.workers), pipeline.logs()
    logs = pipeline.logs()
    assert "unregistered task" in logs and "utxoflow.block.no_such_task" in logs, logs

    pipeline.redis.lpush("blocks", GARBAGE)
    until(lambda: pipeline.redis.llen("blocks") == 0, 10, why="the garbage taken off the queue")
    pipeline.enqueue("block", chain.blocks[2:])
    check_complete(pipeline, chain, base)
    assert all(p.poll() is None for p in pipeline.workers), pipeline.logs()


@pytest.mark.timeout(60)
def test_garbage_on_the_blocks_queue_leaves_the_worker_alive(pipeline: Pipeline) -> None:
    chain, base = small_chain(pipeline, 1)
    w1 = pipeline.start_worker("w1")
    pipeline.redis.lpush("blocks", GARBAGE)
    until(lambda: pipeline.redis.llen("blocks") == 0, 10, why="the garbage taken off the queue")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and "Unrecoverable error" not in pipeline.log("w1"):
        time.sleep(0.05)
    assert "Unrecoverable error" not in pipeline.log("w1") and w1.poll() is None, pipeline.log("w1")
    until(lambda: pipeline.redis.llen(DEAD_LETTERS) == 1, 10, why="the message set aside")  # (kombu_fix)
    (record,) = dead_letters(pipeline)
    assert record["head"] == GARBAGE.decode() and record["bytes"] == len(GARBAGE), record
    assert record["sha256"] == hashlib.sha256(GARBAGE).hexdigest() and "not JSON" in record["reason"]
    assert "set aside a message that is not JSON" in pipeline.log("w1")
    pipeline.enqueue("block", chain.blocks)
    check_complete(pipeline, chain, base)


def envelope(body: object = None, **props: object) -> dict[str, object]:
    """A kombu message as the Redis transport stores it (a Celery task's, less its task)."""
    info = {"exchange": "", "routing_key": "blocks"}
    base = {"delivery_tag": str(uuid.uuid4()), "body_encoding": "base64", "delivery_info": info,
            "priority": 0, "delivery_mode": 2}
    return {"body": base64.b64encode(b"{}").decode() if body is None else body,
            "content-encoding": "utf-8", "content-type": "application/json", "headers": {},
            "properties": {**base, **props}}


# JSON that kombu cannot make a message of, each with the piece of the shape it breaks
NOT_KOMBU = {
    "null": None, "number": 42, "list": [1, 2, 3], "string": "block", "empty object": {},
    "properties not an object": {**envelope(), "properties": 7},
    "body not base64": envelope("abc"),
    "unknown body encoding": envelope(body_encoding="rot13"),
    "no delivery tag": {**envelope(), "properties": {k: v for k, v in envelope()["properties"].items()
                                                     if k != "delivery_tag"}},
    "no delivery info": envelope(delivery_info=None),
    "delivery info without a route": envelope(delivery_info={"exchange": ""}),
}  # fmt: skip
# task messages that would stop or loop a consumer (issue 40): set aside as well
TASK = {"task": "utxoflow.block.arrived", "id": "poison-1", "lang": "py"}
POISON = {
    "a task message without an id": {**envelope(), "headers": {k: v for k, v in TASK.items() if k != "id"}},
    "a body that is an object": {**envelope(base64.b64encode(b'{"a": 1}').decode()), "headers": TASK},
    "a body of two items": {**envelope(base64.b64encode(b'[["x", "y"], {}]').decode()), "headers": TASK},
    "a body that is not JSON": {**envelope(base64.b64encode(b"\x80pickle").decode()), "headers": TASK},
}  # fmt: skip
# kombu messages Celery cannot run: Celery rejects them itself (no task header, a body no task
# has), and lives on
NOT_TASKS = [envelope(), envelope(base64.b64encode(b"not json").decode()), {**envelope(), "headers": None}]


def dead_letters(pipeline: Pipeline) -> list[dict[str, Any]]:
    return [json.loads(r) for r in pipeline.redis.lrange(DEAD_LETTERS, 0, -1)]


@pytest.mark.timeout(120)
def test_json_of_any_shape_on_the_blocks_queue_leaves_the_worker_alive(pipeline: Pipeline) -> None:
    chain, base = small_chain(pipeline, 2)
    w1 = pipeline.start_worker("w1")
    pipeline.enqueue("block", chain.blocks[:1])
    check_complete(pipeline, chain, base, upto=1)
    big = json.dumps(envelope(base64.b64encode(b"[" * (2 << 20)).decode())).encode()  # 2.7 MB
    aside = [json.dumps(m).encode() for m in [*NOT_KOMBU.values(), *POISON.values()]] + [big]
    for raw in [*aside, *(json.dumps(m).encode() for m in NOT_TASKS)]:
        pipeline.redis.lpush("blocks", raw)
    until(lambda: pipeline.redis.llen("blocks") == 0, 20, why="the messages taken off the queue")
    pipeline.enqueue("block", chain.blocks[1:])
    check_complete(pipeline, chain, base)
    log = pipeline.log("w1")
    assert w1.poll() is None and "Unrecoverable error" not in log, log
    assert log.count("Connection to broker lost") == 0, log  # (a missing id once looped the consumer)
    kept = dead_letters(pipeline)  # a bounded record of each, the newest first
    assert sorted(k["sha256"] for k in kept) == sorted(hashlib.sha256(r).hexdigest() for r in aside)
    assert all(len(json.dumps(k)) < 2_000 for k in kept), kept
    assert int(pipeline.redis.get(DEAD_LETTERS_TOTAL) or 0) == len(aside)
    for why, m in POISON.items():
        (k,) = [k for k in kept if k["sha256"] == hashlib.sha256(json.dumps(m).encode()).hexdigest()]
        assert "not a task message a worker can take" in k["reason"], (why, k)
        assert '"utxoflow.block.arrived"' in k["headers"], (why, k)
    (k,) = [k for k in kept if k["bytes"] == len(big)]
    assert "at most 1,048,576" in k["reason"], k
    r = pipeline.utxo("dead-letters")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == len(aside), r.stderr
    r = pipeline.utxo("status", "--json")
    assert json.loads(r.stdout)["dead_letters"] == len(aside), r.stdout
    r = pipeline.utxo("dead-letters", "--drop")
    assert r.returncode == 0 and json.loads(r.stdout) == {"dropped": len(aside)}, r.stdout + r.stderr
    assert pipeline.redis.llen(DEAD_LETTERS) == 0 and pipeline.utxo("dead-letters").stdout == ""


def test_a_worker_that_dies_exits_non_zero(pipeline: Pipeline) -> None:
    """An unrecoverable error in the worker (here injected into Celery's consumer as it starts)
    ends `utxo worker` with a non-zero status, not 0: a supervisor must see it die."""
    code = (
        "import sys\n"
        "from celery.worker.consumer import Consumer\n"
        "def boom(self): raise RuntimeError('injected: the consumer cannot start')\n"
        "Consumer.start = boom\n"
        "from workers.cli import main\n"
        "sys.argv = ['utxo', 'worker', '-Q', 'recovery']\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=pipeline.env, cwd=pipeline.tmp,
                       capture_output=True, text=True, timeout=60)
    assert "injected: the consumer cannot start" in r.stdout + r.stderr, r.stdout + r.stderr
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])


@pytest.mark.timeout(60)
def test_a_block_message_naming_no_stored_block_is_given_up(pipeline: Pipeline) -> None:
    chain, base = small_chain(pipeline, 1)
    pipeline.start_worker("w1")
    pipeline.register(f"block:{NO_BLOCK}")  # as `utxo enqueue` registers
    send(pipeline, "utxoflow.block.arrived", NO_BLOCK, f"block:{NO_BLOCK}")
    pipeline.enqueue("block", chain.blocks)
    r = pipeline.utxo("wait", "--timeout", "5", timeout=40)
    assert r.returncode == 0, r.stdout + r.stderr
    check_complete(pipeline, chain, base)


def test_wait_on_an_id_it_cannot_look_up_times_out(pipeline: Pipeline) -> None:
    """A pending id that names no block hash (not one `utxo enqueue` makes, but a client may
    register anything) only its task can settle: `utxo wait` times out (1) rather than fail (2)."""
    pipeline.register("block:x")
    r = pipeline.utxo("wait", "--timeout", "0.5")
    assert (r.returncode, r.stdout.strip()) == (1, '{"done": false, "pending": 1, "refused": 0}'), r.stderr


@pytest.mark.timeout(120)
def test_a_worker_whose_store_is_not_there_yet_waits_for_it(pipeline: Pipeline) -> None:
    """A UTXO store that cannot be reached yet (its database not created): the worker waits for
    it before taking a single message (workers/runtime/startup.py), then applies what was queued."""
    name = f"utxoflow_late_{uuid.uuid4().hex[:10]}"
    url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    c = Chain()
    for _ in range(3):
        c.add()
    pipeline.enqueue("block", c.blocks)  # (`utxo enqueue` opens every store: it does so here)
    queued = pipeline.redis.llen("blocks")
    pipeline.env["UTXO_STORE_URL"] = url
    pipeline._start("w1", ["worker", "-n", "w1@test"], b"waiting for UTXO_STORE_URL", "worker")
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        try:
            time.sleep(1)
            assert pipeline.redis.llen("blocks") == queued == 3, pipeline.log("w1")  # nothing taken
            admin.execute(f'CREATE DATABASE "{name}"')
            pipeline.wait(60)
            assert pipeline.tip()["height"] == 3
            assert "Traceback" not in pipeline.log("w1"), pipeline.log("w1")
        finally:
            pipeline.stop(graceful=False)
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("setting", "value", "wait", "says"), [
    ("UTXO_STORE_URL", "mysql://x/y", "60", "cannot work: unknown UTXO store URL scheme 'mysql'"),
    ("UTXO_STATE_URL", "redis://127.0.0.1:6379/0", "60", "cannot work: unknown state store URL scheme"),
    ("UTXO_BLOB_URL", "ftp://x/y", "60", "cannot work: unknown blob store URL scheme 'ftp'"),
    ("UTXO_STORE_URL", "postgresql://postgres@127.0.0.1:1/x", "2", "could not be reached in 2 s"),
])  # fmt: skip
def test_a_worker_whose_stores_cannot_work_refuses_to_start(
    pipeline: Pipeline, setting: str, value: str, wait: str, says: str
) -> None:
    """Before it takes a single message: one line naming the setting, exit 2, the queue as it
    was (a worker that took messages it can only fail would starve the ones that can apply them)."""
    c = Chain()
    c.add()
    pipeline.enqueue("block", c.blocks)
    queued = pipeline.redis.llen("blocks")
    bad = {**pipeline.env, setting: value, "UTXO_STORE_WAIT": wait}
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "workers.cli", "worker", "-n", "bad@test"], env=bad,
                       cwd=pipeline.tmp, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) >= 1, (r.returncode, r.stderr)
    assert lines[-1].startswith("utxo: ") and setting in lines[-1] and says in lines[-1], r.stderr
    assert time.monotonic() - t < float(wait) + 20
    assert pipeline.redis.llen("blocks") == queued == 1


def test_a_worker_with_a_bad_log_level_is_a_usage_error(pipeline: Pipeline) -> None:
    r = pipeline.utxo("worker", "-l", "bogus", timeout=60)
    assert r.returncode == 2 and "bogus" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.timeout(180)
def test_pool_child_killed_mid_batch(pipeline: Pipeline) -> None:
    """Two workers, SQLite, a block's phases run by its coordinator (no helpers): the holder
    applies the blocks the other worker indexed meanwhile in batches (one transaction each).
    Its pool child is killed while the `applying` mark names a batch of several blocks; the
    next holder takes back what the mark names and the chain still ends complete, equal to the
    model."""
    pipeline.env["UTXO_BLOCK_CHUNK_HELPERS"] = "0"  # (helpers would keep each block apart)
    pipeline.env["UTXO_BLOCK_CHUNK_TXS"] = "1000"
    chain, base = big_chain(pipeline, 16, 2_000)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    enqueue = pipeline.enqueue_start("block", chain.blocks)
    state = pipeline.open_state()
    try:

        def batch_open() -> tuple[int, int] | None:
            marks = applying_blocks(state)
            holder = state.lease_holder(LEASE)
            if len(marks) < 2 or holder is None:
                return None
            return int(holder.split(":")[1]), len(marks)

        child, n = until(batch_open, 60, poll=0.002, why="a batch of several blocks being applied")
    finally:
        state.close()
    os.kill(child, signal.SIGKILL)
    enqueue.communicate(timeout=60)
    assert enqueue.returncode == 0
    assert n >= 2
    check_complete(pipeline, chain, base)
    assert "Traceback" not in pipeline.logs() or "WorkerLostError" in pipeline.logs()


@pytest.mark.timeout(120)
def test_a_surviving_idle_worker_finishes_a_killed_workers_block_within_a_lease(pipeline: Pipeline) -> None:
    """Two workers; the one applying the last block is SIGKILLed whole, so its message stays in
    Redis's `unacked` hash (for an hour) and the other worker has nothing left on the queue. The
    recovery manager running inside the survivor sees the chain not at rest with nobody holding
    its lease and sends a block message at once; and, its lease later, gives the dead worker's
    message back. No beat runs, and nothing waits for UTXO_REQUEUE_AFTER."""
    pipeline.env.update({"UTXO_RECOVERY_LEASE": "3", "UTXO_RECOVERY_SCAN_INTERVAL": "0.5",
                         "UTXO_REQUEUE_AFTER": "1h"})
    chain, base = big_chain(pipeline, 3, 10_000)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    enqueue = pipeline.enqueue_start("block", chain.blocks)
    child, h = applying_pid(pipeline, chain.blocks[-1])
    victim = pipeline.workers[owner(pipeline, child)]
    names = ("w1", "w2")
    survivor = next(n for n, p in zip(names, pipeline.workers, strict=True) if p is not victim)
    dead = next(n for n in names if n != survivor)
    # the message the victim applies is noted as its own (what lets the manager give it back)
    held = list(pipeline.redis.hkeys("unacked"))
    assert f"{dead}@test".encode() in pipeline.redis.hmget("utxoflow:taken", held), held
    time.sleep(0.05)  # well inside the block
    os.killpg(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait()
    enqueue.communicate(timeout=60)
    until(lambda: pipeline.tip()["hash"] == parse_block(chain.blocks[-1]).hash[::-1].hex(), 20,
          0.2, "the survivor applying the last block")
    assert time.monotonic() - killed_at < 15  # a lease and a few scans, not UTXO_REQUEUE_AFTER
    check_complete(pipeline, chain, base)
    log = pipeline.log(survivor)
    assert f"taking back block {display(h)}, left half applied" in log, log
    # the dead worker's message itself is given back too, and then taken and acknowledged
    until(lambda: "gave back 1 message(s) that dead workers held" in pipeline.log(survivor), 20, 0.2,
          "the dead worker's message given back")
    until(lambda: pipeline.redis.hlen("unacked") == 0, 20, 0.2, "nothing left unacknowledged")
    outcomes = json.loads(pipeline.utxo("recover").stdout)["outcomes"]
    assert outcomes["block"]["chain taken up"] >= 1 and outcomes["message"]["given back"] >= 1, outcomes
