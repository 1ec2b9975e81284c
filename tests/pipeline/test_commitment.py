"""The UTXO-set commitment when the chain passes between workers: each worker carries the last
block it applied (its commitment, and the coins it made, so the next block needs no read of
them) — and must drop both when another worker moved the chain meanwhile, here by a reorg that
mines the same transaction at another height. Checked against the model after every step."""

from __future__ import annotations

import random
from pathlib import Path

from stores.blob import open_blob_store
from stores.state import BlockStatus, open_state_store
from stores.utxo import open_utxo_store
from tests.pipeline.chains import spend
from tests.pipeline.world import World
from workers.chainstate.commitment import RecentCoins
from workers.chainstate.sequencer import Sequencer


def test_a_worker_takes_up_the_chain_after_another_mined_its_coins_at_another_height(
    seq: Sequencer, urls: tuple[str, str], tmp_path: Path
) -> None:
    a = World(seq)  # worker A: the fixture's sequencer
    blobs = f"file://{tmp_path}/blobs"
    b = Sequencer(open_utxo_store(urls[0], blob_url=blobs), open_state_store(urls[1]), open_blob_store(blobs))
    try:
        fork = len(a.chain.blocks) - 1  # the block t's block will follow
        t = spend((a.funds[1], 0), n_outputs=2)
        a.add([t])  # A mines t at height 1002 and keeps its coins
        side = a.chain.fork(fork)
        side.add([spend((a.funds[2], 0))])  # height 1002, without t
        for raw in (side.blocks[-1], side.add([t])):  # t again, at 1003: B takes the chain over
            b.submit(raw)
        tip = a.seq.state.tip()
        assert tip is not None and tip.hash == side.parent and tip.height == 1003
        a.chain = side
        a.check()
        # A applies the next block, spending t's coins: their height is 1003 now, not 1002
        e = a.seq.submit(side.add([spend((t, 0), (t, 1))]))
        assert e.status is BlockStatus.APPLIED
        a.check()
        a.add([spend((a.funds[3], 0))])  # and goes on from its own last block
    finally:
        b.utxo.close()
        b.state.close()


def test_recent_coins_are_bounded_and_keep_the_newest() -> None:
    # A model: the coins added, in order, minus those taken. The cache may forget any but the
    # newest half of its bound, never hands a coin out twice, and never holds more than its bound.
    rng = random.Random(11)
    coins = RecentCoins(max_bytes=700 * 100)  # 100 coins
    assert coins.max_coins == 100
    added: list[tuple[bytes, int]] = []
    taken: set[tuple[bytes, int]] = set()
    for step in range(60):
        batch = {(bytes([step, k]), k): (step * 1000 + k, k) for k in range(rng.randrange(1, 40))}
        coins.add(batch)
        added += batch
        assert len(coins) <= 100
        ask = rng.sample(added, min(len(added), 15))
        found, missing = coins.take(ask)
        assert set(found) | set(missing) == set(ask) and not set(found) & set(missing)
        for op, c in found.items():
            assert op not in taken and c == (op[0][0] * 1000 + op[1], op[1])
        taken |= set(found)
        if step % 10 == 9:  # now and then: the newest half of the bound is all there
            newest = [op for op in added[-50:] if op not in taken]
            held, _ = coins.take(newest)
            assert set(held) == set(newest)
            taken |= set(held)
    big = {(b"\xff" + i.to_bytes(2, "big"), 0): (i, 0) for i in range(250)}  # more than a generation
    coins.add(big)
    assert len(coins) <= 100
    found, _ = coins.take(list(big)[-50:])
    assert len(found) == 50
    again = (b"\xee", 1)  # added again while its first copy is in the old generation
    fresh = RecentCoins(max_bytes=700 * 100)
    fresh.add({again: (1, 1)})
    fresh.add({(b"\xef" + i.to_bytes(2, "big"), 0): (i, 0) for i in range(49)})
    fresh.add({(b"\xf0", 0): (0, 0)})  # the young generation was full: it is the old one now
    fresh.add({again: (2, 2)})
    assert fresh.take([again]) == ({again: (2, 2)}, [])
    assert fresh.take([again]) == ({}, [again])  # never handed out twice
    coins.clear()
    assert len(coins) == 0 and coins.take([(b"\xff\x00\x01", 0)]) == ({}, [(b"\xff\x00\x01", 0)])
