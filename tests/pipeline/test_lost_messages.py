"""A block message lost on its way to a worker — popped from the queue by a worker that died
before kombu wrote it to `unacked`, or before the worker noted the delivery — is sent again by
the recovery manager within a lease, not after UTXO_REQUEUE_AFTER (`RecoveryManager._lost_blocks`,
`liveness.held_block_messages`); and what counts as held, read from real kombu messages."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from stores.blob import open_blob_store
from tests.pipeline.chains import Chain
from tests.pipeline.workers import Pipeline, faults, pipeline_fixture, until  # noqa: F401  (fixture)
from workers.chainstate.blockindex import keep_block
from workers.demo.demochain import block_hash
from workers.recovery.liveness import TAKEN, UNACKED, held_block_messages, message_ident


def quick_recovery(pipeline: Pipeline, lease_s: int) -> None:
    """A recovery manager that scans often, on a short lease; nothing re-sent for its age (the
    only re-sends are the lost-message ones under test)."""
    pipeline.env.update({"UTXO_RECOVERY_LEASE": str(lease_s), "UTXO_RECOVERY_SCAN_INTERVAL": "0.5",
                         "UTXO_REQUEUE_AFTER": "1h"})


def tip_height(pipeline: Pipeline) -> int | None:
    r = pipeline.utxo("tip")
    return int(json.loads(r.stdout)["height"]) if r.returncode == 0 else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("in_unacked", [True, False], ids=["unacked-not-noted", "popped-not-unacked"])
def test_a_worker_killed_between_taking_a_block_message_and_noting_it(
    pipeline: Pipeline, tmp_path: Path, in_unacked: bool
) -> None:
    """The exact point: the worker has the message (kombu wrote it to `unacked`) and dies before
    it notes the delivery as its own, so the dead worker's messages that the manager gives back
    do not include it; or (its `unacked` entry removed by hand, issue 40's reproduction) it
    died between popping the message and kombu's write, so the message is nowhere. The block
    was sent past the door (not indexed), so the chain looks at rest. Another worker's manager
    sends it again within a lease."""
    quick_recovery(pipeline, lease_s=6)
    c = Chain()
    for _ in range(3):
        c.add()
    marker = tmp_path / "parked"
    w1 = pipeline.start_worker("w1", env=faults("block_received", marker))
    (first,) = pipeline.submit("block", c.blocks[:1])
    until(marker.exists, 30, 0.05, "the worker parked with the message")
    tags = [t.decode() for t in pipeline.redis.hkeys(UNACKED)]
    assert len(tags) == 1 and pipeline.redis.hget(TAKEN, tags[0]) is None  # held, not noted
    if not in_unacked:
        pipeline.redis.hdel(UNACKED, tags[0])
        pipeline.redis.zrem("unacked_index", tags[0])
    os.killpg(w1.pid, signal.SIGKILL)
    w1.wait()
    killed_at = time.monotonic()
    pipeline.start_worker("w2")
    until(lambda: tip_height(pipeline) == 1, 60, 0.2, "the block applied by the other worker")
    assert time.monotonic() - killed_at < 40  # a third of a lease and two scans, not an hour
    assert f"block:{first}" in pipeline.log("w2")
    pipeline.enqueue("block", c.blocks[1:])
    pipeline.wait(60)
    assert pipeline.tip()["height"] == 3


@pytest.mark.timeout(120)
def test_a_block_message_lost_before_any_worker_held_it_is_sent_again_within_a_lease(
    pipeline: Pipeline,
) -> None:
    quick_recovery(pipeline, lease_s=6)
    c = Chain()
    for _ in range(4):
        c.add()
    pipeline.start_worker("w1")
    pipeline.enqueue("block", c.blocks[:2])
    pipeline.wait(60)
    # block 3 as `utxo enqueue` leaves it when its message is then lost: its bytes stored, its id
    # pending, not indexed (the index lease was busy at the door), and no message anywhere
    lost = block_hash(c.blocks[2])
    blobs = open_blob_store(pipeline.env["UTXO_BLOB_URL"])
    keep_block(blobs, lost, c.blocks[2])
    pipeline.register(f"block:{lost[::-1].hex()}")
    lost_at = time.monotonic()
    pipeline.enqueue("block", c.blocks[3:])  # (indexed as an orphan: its parent is unknown)
    until(lambda: pipeline.tip()["height"] == 4, 60, 0.2, "the chain past the lost block")
    assert time.monotonic() - lost_at < 30  # a third of a lease and two scans, not an hour
    pipeline.wait(30)
    log = pipeline.log("w1")
    assert "re-sent 1 block message(s) no queue or worker held: block:" + lost[::-1].hex() in log, log
    assert log.count("re-sent 1 block message(s)") == 1  # once: then the queue held it


def test_held_block_messages_reads_the_queue_and_noted_deliveries(pipeline: Pipeline) -> None:
    """Real messages as `utxo enqueue` sends them (no worker takes them here)."""
    c = Chain()
    for _ in range(3):
        c.add()
    pipeline.enqueue("block", c.blocks)
    r = pipeline.redis
    idents = {f"block:{block_hash(b)[::-1].hex()}" for b in c.blocks}
    assert {message_ident(raw) for raw in r.lrange("blocks", 0, -1)} == idents
    assert held_block_messages(r) == idents
    # a worker pops one and kombu notes it unacked, as its Redis transport does
    raw = r.rpop("blocks")
    assert raw is not None
    one = message_ident(raw)
    r.hset(UNACKED, "tag-1", json.dumps([json.loads(raw), "", "blocks"]))
    assert held_block_messages(r) == idents - {one}  # not noted by a worker (yet): not held
    r.hset(TAKEN, "tag-1", "w9@test")
    assert held_block_messages(r) == idents
    assert message_ident(b"not json") is None and message_ident(json.dumps({"body": "x"})) is None


@pytest.mark.timeout(180)
def test_a_worker_killed_between_indexing_a_block_and_placing_its_orphans(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    """Issue 40: the block's own commit and its orphan descendants' are two; a worker killed
    between them left the descendants orphans under a connected parent for good (the tip stuck
    at the block). Whatever takes the block up again (here the next worker's resume message)
    places them again, and the chain reaches its end."""
    quick_recovery(pipeline, lease_s=3)
    c = Chain()
    for _ in range(6):
        c.add()
    pipeline.start_worker("w0")
    pipeline.enqueue("block", c.blocks[:2])
    pipeline.enqueue("block", c.blocks[3:])  # orphans: their ancestor 3 is unknown
    assert pipeline.wait(60)["orphans"] == 3
    pipeline.stop()
    pipeline.workers.clear()
    marker = tmp_path / "parked"
    w1 = pipeline.start_worker("w1", env=faults("block_indexed", marker))
    pipeline.submit("block", c.blocks[2:3])  # past the door: the worker indexes it
    until(marker.exists, 30, 0.05, "the worker parked between the two commits")
    os.killpg(w1.pid, signal.SIGKILL)
    w1.wait()
    state = pipeline.open_state()
    try:
        statuses = [e.status.value if e else None for e in (state.get_block(block_hash(b)) for b in c.blocks)]
    finally:
        state.close()
    assert statuses == ["applied", "applied", "pending", "orphan", "orphan", "orphan"], statuses
    pipeline.start_worker("w2")
    until(lambda: tip_height(pipeline) == 6, 60, 0.2, "the chain at its end")
    assert "3 descendant(s) left as orphans placed again" in pipeline.log("w2"), pipeline.log("w2")
    assert "orphans" not in pipeline.wait(60)
