"""What `utxo wait` tells once it is done: blocks that wait as orphans (their parent never
came), each refusal once — also one made before the wait began, never again by a later wait —
and exit 4 only while a refusal is new."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.chains import Chain, funding, spend
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (fixture)
from workers.demo.demochain import block_hash


@pytest.mark.timeout(120)
def test_wait_names_orphans_and_reports_each_refusal_once(pipeline: Pipeline) -> None:
    c = Chain()
    for _ in range(4):
        c.add()
    pipeline.start_worker("w1")
    pipeline.enqueue("block", [c.blocks[0], c.blocks[2]])  # the second's parent is held back
    r = pipeline.utxo("wait", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    hexed = [block_hash(b)[::-1].hex() for b in c.blocks]
    out = json.loads(r.stdout)
    assert out["orphans"] == 1 and out["orphan_blocks"] == [{"hash": hexed[2], "parent": hexed[1]}], out
    assert "1 block(s) wait as orphans, their parent unknown" in r.stderr, r.stderr

    bad = c.next_block([spend((funding(1)[0], 0))])  # spends an output no one made
    pipeline.enqueue("block", [c.blocks[1], c.blocks[3], bad])
    pipeline.utxo("wait", "--timeout", "60")  # (one wait may or may not see the refusal)
    again = pipeline.wait(60, refused=0)  # reported before: not again, exit 0
    assert "orphans" not in again and pipeline.tip()["hash"] == hexed[3]
    state = pipeline.open_state()
    try:
        (logged,) = state.last_refusals(5)
    finally:
        state.close()
    assert logged.kind == "block" and logged.key == block_hash(bad)[::-1].hex(), logged
