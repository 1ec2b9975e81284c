"""An operator's verdicts on blocks (`Sequencer.invalidate`, `.reconsider`; `utxo invalidate`,
`utxo reconsider`), as Bitcoin Core's invalidateblock and reconsiderblock: an applied block
invalidated takes the chain down to its parent and a lighter branch over; reconsidered, the
heavier chain comes back; a block that is really invalid is refused again for its own reason.
Every step's tip and confirmed set checked against a model built from the blocks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from chain import Tx
from stores.blob import open_blob_store
from stores.state import BlockStatus, StateStore, open_state_store
from stores.utxo import UtxoStore, open_utxo_store
from tests.pipeline.chains import SNAPSHOT_HASH, confirmed, confirmed_model, funding, outpoints, seed, spend
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (fixture)
from workers.chainstate.sequencer import Sequencer
from workers.demo.demochain import block_hash

World = tuple[UtxoStore, StateStore, Sequencer]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    utxo = open_utxo_store(f"sqlite:///{tmp_path}/utxo.db", blob_url=f"file://{tmp_path}/blobs", retention=3)
    state = open_state_store(f"sqlite:///{tmp_path}/state.db")
    yield utxo, state, Sequencer(utxo, state, open_blob_store(f"file://{tmp_path}/blobs"))
    utxo.close()
    state.close()


def status(state: StateStore, raw: bytes) -> tuple[BlockStatus, str | None]:
    e = state.get_block(block_hash(raw))
    assert e is not None
    return e.status, e.reason


def test_invalidate_and_reconsider_move_the_chain_as_core_does(world: World) -> None:
    utxo, state, seq = world
    fund = funding(6)
    base = outpoints(fund)
    c = seed(utxo, fund)
    c.add([spend((fund[0], 0))])
    c.add([spend((fund[1], 0))])
    side = c.fork(1)  # a lighter branch from the second block: 2 blocks against 3
    c.add([spend((fund[2], 0)), spend((c.txs[0][1], 0))])
    c.add([spend((fund[4], 0))])
    c.add()
    side.add([spend((fund[3], 0))])
    side.add([spend((fund[2], 0))])  # (spends what the main chain's third block spends too)
    for raw in [*c.blocks, *side.blocks[2:]]:
        seq.submit(raw)

    def chain_is(blocks: list[bytes], txs: list[list[Tx]]) -> None:
        tip = state.tip()
        assert tip is not None and tip.hash == block_hash(blocks[-1])
        assert confirmed(utxo) == confirmed_model(txs, base)

    chain_is(c.blocks, c.txs)
    third = block_hash(c.blocks[2])
    bad = seq.invalidate(third, "looked wrong")
    assert bad.status is BlockStatus.INVALID and bad.reason == "looked wrong"
    below = (BlockStatus.INVALID, "its parent is invalid")
    assert status(state, c.blocks[3]) == status(state, c.blocks[4]) == below
    chain_is(c.blocks[:2], c.txs[:2])  # down to its parent, nothing applied yet
    best = state.best_candidate()
    assert best is not None and best.hash == block_hash(side.blocks[-1])  # what `utxo` then enqueues
    seq.advance()
    chain_is(side.blocks, side.txs)
    assert seq.reconsider(block_hash(c.blocks[0])) == []  # (not invalid: nothing to do)
    placed = seq.reconsider(block_hash(c.blocks[4]))  # (a descendant: its invalid ancestor too)
    assert [b.hash for b in placed] == [block_hash(r) for r in c.blocks[2:]]
    # placed by work against the side branch's tip (2 blocks above the fork): lighter, as heavy
    # (the tip keeps a tie), heavier
    assert [b.status for b in placed] == [BlockStatus.SIDE, BlockStatus.SIDE, BlockStatus.PENDING]
    assert not any(b.reason for b in placed)
    seq.advance()
    chain_is(c.blocks, c.txs)
    assert status(state, side.blocks[-1])[0] is BlockStatus.SIDE

    with pytest.raises(KeyError):
        seq.invalidate(b"\x01" * 32, "x")
    with pytest.raises(ValueError, match="the chain's base"):
        seq.invalidate(SNAPSHOT_HASH, "x")
    with pytest.raises(ValueError, match="deeper than the retention"):
        seq.invalidate(block_hash(c.blocks[0]), "x")  # 5 below the tip, retention 3
    chain_is(c.blocks, c.txs)


def test_a_block_invalid_for_itself_is_refused_again_when_reconsidered(world: World) -> None:
    utxo, state, seq = world
    fund = funding(2)
    c = seed(utxo, fund)
    c.add([spend((fund[0], 0))])
    seq.submit(c.blocks[0])
    double = c.next_block([spend((fund[0], 0), fee=2000)])  # spends what the first block spent
    seq.submit(double)
    first = status(state, double)
    assert first[0] is BlockStatus.INVALID and first[1], first
    placed = seq.reconsider(block_hash(double))
    assert [b.status for b in placed] == [BlockStatus.PENDING]  # (the tip's child: heavier)
    seq.advance()
    assert status(state, double) == first  # checked again when applied: the same verdict
    tip = state.tip()
    assert tip is not None and tip.hash == block_hash(c.blocks[0])
    assert confirmed(utxo) == confirmed_model(c.txs, outpoints(fund))


@pytest.mark.timeout(240)
def test_utxo_invalidate_and_reconsider_with_a_worker(pipeline: Pipeline) -> None:
    fund = funding(4)
    c = pipeline.seed(fund)
    for k in range(4):
        c.add([spend((fund[k], 0))])
    pipeline.start_worker("w1")
    pipeline.enqueue("block", c.blocks)
    pipeline.wait(60)
    third = block_hash(c.blocks[2])[::-1].hex()

    r = pipeline.utxo("invalidate", third, "--reason", "a test said so")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    said = {"hash": third, "height": c.height - 2, "status": "invalid", "reason": "a test said so"}
    assert out["block"] == said
    assert out["tip"]["hash"] == block_hash(c.blocks[1])[::-1].hex() and "enqueued" not in out
    r = pipeline.utxo("block", block_hash(c.blocks[3])[::-1].hex())
    assert r.returncode == 0 and json.loads(r.stdout)["reason"] == "its parent is invalid", r.stdout
    assert pipeline.confirmed() == confirmed_model(c.txs[:2], outpoints(fund))

    r = pipeline.utxo("reconsider", third)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [b["status"] for b in out["placed"]] == ["pending", "pending"]
    assert out["enqueued"]["hash"] == block_hash(c.blocks[-1])[::-1].hex()
    pipeline.wait(60)
    assert pipeline.tip()["hash"] == block_hash(c.blocks[-1])[::-1].hex()
    assert pipeline.confirmed() == confirmed_model(c.txs, outpoints(fund))

    for args, says in [(("invalidate", "ab" * 32), "is not known"), (("reconsider", "zz"), "HASH:"),
                       (("invalidate", SNAPSHOT_HASH[::-1].hex()), "the chain's base")]:
        r = pipeline.utxo(*args)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert pipeline.tip()["hash"] == block_hash(c.blocks[-1])[::-1].hex()
