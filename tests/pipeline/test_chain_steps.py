"""The chain's steps under faults and limits, on every backend: a state-store failure between the
UTXO store's part of a step and its commit, a rebase interrupted half way, a reorg deeper than
the retention, undo records past it, a candidate above an invalid block, the time budget, and a
disconnected block's coinbase."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chain import parse_block
from stores.blob import open_blob_store
from stores.errors import StorageError
from stores.state import BlockStatus, open_state_store
from stores.utxo import open_utxo_store
from tests.pipeline.chains import SNAPSHOT_HASH, SNAPSHOT_HEIGHT, Chain, confirmed, confirmed_model, spend
from tests.pipeline.world import World
from workers.chainstate.sequencer import APPLYING, Sequencer, Unfinished


def short_memory(urls: tuple[str, str], tmp_path: Path, retention: int) -> Sequencer:
    utxo = open_utxo_store(urls[0], retention=retention, blob_url=f"file://{tmp_path}/blobs")
    return Sequencer(utxo, open_state_store(urls[1]), open_blob_store(f"file://{tmp_path}/blobs"))


@pytest.fixture
def short(urls: tuple[str, str], tmp_path: Path) -> Iterator[Sequencer]:
    seq = short_memory(urls, tmp_path, retention=3)
    yield seq
    seq.utxo.close()
    seq.state.close()


def test_a_failed_commit_leaves_the_chain_where_it_was_then_goes_on(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UTXO store applied the block, then the state store failed to commit the step (the
    connection killed): the tip is where it was, the block is marked as being applied, and the
    next pass takes it back and applies it again — the chain is never lower, never half moved."""
    w = World(seq)
    real = seq.state.commit
    failed: list[Any] = []

    def flaky(**kw: Any) -> None:
        if kw.get("tip") is not None and kw.get("meta", {}).get(APPLYING, 1) is None and not failed:
            failed.append(kw)
            raise StorageError("commit chain state failed: terminating connection")
        real(**kw)

    monkeypatch.setattr(seq.state, "commit", flaky)
    before = seq.state.tip()
    raw = w.chain.add([spend((w.funds[1], 0))])
    seq.store_block(raw)
    seq.accept(parse_block(raw))
    with pytest.raises(StorageError):
        seq.advance()
    assert failed and seq.state.tip() == before
    assert seq.state.get_meta(APPLYING) == parse_block(raw).hash.hex()
    seq.advance()
    w.check()


def test_a_rebase_interrupted_half_way_is_finished_by_the_next_pass(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Chain()
    for _ in range(8):
        c.add()
    for k in (3, 4, 5, 6, 1):
        seq.submit(c.blocks[k])
    real = seq._take_back
    calls: list[int] = []

    def dies_once(e: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise StorageError("the worker died here")
        real(e)

    monkeypatch.setattr(seq, "_take_back", dies_once)
    seq.store_block(c.blocks[2])
    seq.accept(parse_block(c.blocks[2]))  # block 2 links 1 to the base (3): a rebase to 1 is noted
    with pytest.raises(StorageError):
        seq.advance()
    monkeypatch.undo()
    for raw in [c.blocks[0], c.blocks[7]]:
        seq.submit(raw)
    for k, raw in enumerate(c.blocks):
        e = seq.state.get_block(parse_block(raw).hash)
        assert e is not None and (e.height, e.status) == (k + 1, BlockStatus.APPLIED), (k, e)
    assert confirmed(seq.utxo) == confirmed_model(c.txs)


def test_a_reorg_deeper_than_the_retention_is_refused(short: Sequencer) -> None:
    w = World(short)  # one block applied
    for _ in range(4):
        w.add()
    side = Chain(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1)
    raws = [side.add() for _ in range(7)]  # forks 5 below the tip, with more work
    tip = short.state.tip()
    for raw in raws:
        short.submit(raw)
    first = short.state.get_block(parse_block(raws[0]).hash)
    assert first is not None and first.status is BlockStatus.INVALID
    assert "deeper than the retention (3)" in (first.reason or "")
    assert short.state.tip() == tip
    w.check()


def test_undo_records_past_the_retention_are_deleted(short: Sequencer) -> None:
    w = World(short)
    for _ in range(6):
        w.add()
    tip = short.state.tip()
    assert tip is not None and tip.height is not None
    kept = [e.height for e in _applied(short) if short.state.get_undo(e.hash) is not None]
    assert kept and min(kept) > tip.height - 3, kept


def _applied(seq: Sequencer) -> list[Any]:
    out = []
    e = seq.state.tip()
    while e is not None and e.status is BlockStatus.APPLIED:
        out.append(e)
        e = seq.state.get_block(e.parent)
    return out


def test_a_candidate_above_an_invalid_block_is_marked_not_tried(seq: Sequencer) -> None:
    """A child indexed as pending while its parent was being refused (the index and the chain
    race) is found invalid by ancestry when it is the best candidate: marked, never applied."""
    w = World(seq)
    bad = w.chain.next_block([spend((w.funds[7], 0)), spend((w.funds[7], 0), fee=9)])
    entry = seq.submit(bad)
    assert entry.status is BlockStatus.INVALID
    kid_hash = b"\x42" * 32
    seq.state.add_block(kid_hash, entry.hash, (entry.height or 0) + 1, 10**9, BlockStatus.PENDING, 1)
    tip = seq.state.tip()
    assert seq.advance() == tip
    kid = seq.state.get_block(kid_hash)
    assert kid is not None and kid.status is BlockStatus.INVALID and kid.reason == "its parent is invalid"


def test_advance_hands_on_after_its_budget(seq: Sequencer) -> None:
    w = World(seq)
    raws = [w.chain.add() for _ in range(3)]
    for raw in raws:
        seq.store_block(raw)
        seq.accept(parse_block(raw))
    with pytest.raises(Unfinished):
        seq.advance(budget_s=0)  # one block, then it hands on
    assert seq.state.tip().hash == parse_block(raws[0]).hash  # type: ignore[union-attr]
    seq.advance()
    w.check()


@pytest.mark.timeout(300)
def test_a_disconnected_coinbase_makes_its_spenders_conflicting(seq: Sequencer) -> None:
    """A reorg takes away the block whose coinbase a later block spent at maturity: the spender
    can never be mined on the new chain, so it is conflicting; when the old chain wins back, it
    is made whole and mined again."""
    w = World(seq)  # block 1001 applied
    coinbase = w.chain.txs[-1][0]  # spendable from 1101
    while w.chain.height < 1101:
        w.add()
    x = spend((coinbase, 0))
    w.add([x])  # at 1101, exactly at maturity
    side = Chain(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1)  # forks below block 1001
    for _ in range(w.chain.height - SNAPSHOT_HEIGHT):  # one block more than the main branch
        seq.submit(side.add())
    assert seq.state.tip().hash == side.parent  # type: ignore[union-attr]
    assert seq.utxo.get(x.txid).conflicting
    w.check(side)
    seq.submit(w.chain.add())  # as heavy as the side branch: the first seen stays
    w.add()  # the main branch is heavier again
    m = seq.utxo.get(x.txid)
    assert not m.conflicting and list(m.block_heights) == [1101]
