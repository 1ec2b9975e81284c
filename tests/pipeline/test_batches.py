"""Consecutive blocks ready to apply share one UTXO-store transaction on SQLite (a batch,
`workers.chainstate.batch`), on every backend: the same chain results; a batch cut short at any
point — before its commit, after it but before the state store's step, at a refused block —
leaves nothing half applied, and the next pass goes on from where the state store says."""

from __future__ import annotations

from typing import Any

import pytest

from chain import Block, TxIn, parse_block
from chain.build import build_tx
from stores.errors import StorageError
from stores.state import BlockStatus
from tests.pipeline.chains import confirmed, confirmed_model, script, spend
from tests.pipeline.world import World
from workers.chainstate import batch
from workers.chainstate.batch import APPLYING, applying_blocks
from workers.chainstate.sequencer import Sequencer


def ready(w: World, n: int, first_fund: int = 1) -> list[bytes]:
    """`n` valid blocks added to the chain and indexed, none applied yet: each spends a fund
    and the previous block's new output (a chain of spends across the blocks)."""
    raws = []
    prev = None
    for k in range(n):
        txs = [spend((w.funds[first_fund + k % 6], 0))] if prev is None else [spend((prev, 0))]
        prev = txs[0]
        raws.append(w.chain.add(txs))
        w.txs.update((t.txid, t) for t in txs)
    for raw in raws:
        w.seq.accept(w.seq.store_block(raw))
    return raws


def finishes(seq: Sequencer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of blocks of each state-store step of applied blocks, as they commit."""
    seen: list[int] = []
    real = seq._finish

    def counted(done: list[Any], still: list[bytes] | None = None) -> None:
        real(done, still)
        seen.append(len(done))

    monkeypatch.setattr(seq, "_finish", counted)
    return seen


def test_ready_blocks_are_applied_in_batches(seq: Sequencer, monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(seq)
    seen = finishes(seq, monkeypatch)
    applied = seq.state.counts()["applied"]
    n = batch.BATCH_BLOCKS + 2
    ready(w, n)
    seq.advance()
    w.check()
    assert seen == ([batch.BATCH_BLOCKS, 2] if seq.fuse else [1] * n)
    assert seq.state.get_meta(APPLYING) is None and seq.state.counts()["applied"] == applied + n


def test_a_batch_whose_state_step_failed_is_taken_back_last_first(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UTXO store committed the batch, then the state store failed (the worker died there):
    the tip is where it was, the mark names every block of the batch, and the next pass takes
    them back, the last first, then applies them again."""
    w = World(seq)
    before = seq.state.tip()
    raws = ready(w, 4)
    real = seq.state.commit
    failed: list[Any] = []

    def flaky(**kw: Any) -> None:
        if kw.get("tip") is not None and not failed:
            failed.append(kw)
            raise StorageError("commit chain state failed: terminating connection")
        real(**kw)

    monkeypatch.setattr(seq.state, "commit", flaky)
    with pytest.raises(StorageError):
        seq.advance()
    assert failed and seq.state.tip() == before
    hashes = [parse_block(r).hash for r in raws]
    fused = seq.fuse
    assert applying_blocks(seq.state) == (hashes if fused else hashes[:1])
    taken: list[bytes] = []
    rollback = seq.applier.rollback

    def noted(block: Block, undo: dict[str, Any]) -> None:
        taken.append(block.hash)
        rollback(block, undo)

    monkeypatch.setattr(seq.applier, "rollback", noted)
    seq.advance()
    assert taken[: len(hashes) if fused else 1] == (hashes[::-1] if fused else hashes[:1])
    w.check()
    assert seq.state.get_meta(APPLYING) is None


def test_a_batch_cut_short_before_its_commit_leaves_nothing(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies inside the third block of a batch: on SQLite none of the batch is in the
    store (one transaction), elsewhere the blocks before it are; either way the next pass
    brings the chain to its tip exactly."""
    w = World(seq)
    before = seq.state.tip()
    ready(w, 5)
    apply = seq.applier.apply
    calls: list[int] = []

    def dies(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise StorageError("the connection was killed")
        return apply(*a, **kw)

    monkeypatch.setattr(seq.applier, "apply", dies)
    with pytest.raises(StorageError):
        seq.advance()
    tip = seq.state.tip()
    assert tip is not None and before is not None
    if seq.fuse:
        assert tip == before and len(applying_blocks(seq.state)) == 3
        assert confirmed(seq.utxo) == confirmed_model(w.chain.txs[:-5], w.base)
    monkeypatch.setattr(seq.applier, "apply", apply)
    seq.advance()
    w.check()


def test_a_refused_block_in_a_batch_keeps_the_blocks_before_it(seq: Sequencer) -> None:
    w = World(seq)
    good = ready(w, 3)
    nowhere = TxIn(b"\x77" * 32, 0, b"\x51", 0xFFFFFFFF)
    bad = w.chain.next_block([build_tx([nowhere], [(1, script())])])  # spends nothing there is
    seq.accept(seq.store_block(bad))
    seq.advance()
    assert seq.state.get_block(parse_block(bad).hash).status is BlockStatus.INVALID  # type: ignore[union-attr]
    assert all(seq.state.get_block(parse_block(r).hash).status is BlockStatus.APPLIED for r in good)  # type: ignore[union-attr]
    w.check()
    assert seq.state.get_meta(APPLYING) is None and seq.state.get_undo(parse_block(bad).hash) is None


def test_a_crash_between_the_batch_and_the_refusal_leaves_the_refused_block_marked(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocks before a refused one are committed with their state step; the worker dies
    before the refusal is: the mark still names the refused block, whose take-back and
    refusal the next pass does."""
    w = World(seq)
    good = ready(w, 2)
    nowhere = TxIn(b"\x77" * 32, 0, b"\x51", 0xFFFFFFFF)
    bad = w.chain.next_block([build_tx([nowhere], [(1, script())])])
    seq.accept(seq.store_block(bad))
    real = seq._invalidate

    def dies(*a: Any, **kw: Any) -> None:
        raise StorageError("the worker died here")

    monkeypatch.setattr(seq, "_invalidate", dies)
    with pytest.raises(StorageError):
        seq.advance()
    assert applying_blocks(seq.state) == [parse_block(bad).hash]
    assert all(seq.state.get_block(parse_block(r).hash).status is BlockStatus.APPLIED for r in good)  # type: ignore[union-attr]
    monkeypatch.setattr(seq, "_invalidate", real)
    seq.advance()
    assert seq.state.get_block(parse_block(bad).hash).status is BlockStatus.INVALID  # type: ignore[union-attr]
    w.check()
    assert seq.state.get_meta(APPLYING) is None and seq.state.get_undo(parse_block(bad).hash) is None


def test_a_holder_that_lost_the_lease_rolls_its_batch_back(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is renewed just before a batch commits: lost by then (another worker took the
    chain), the batch is rolled back, not committed under the new holder's feet."""
    w = World(seq)
    before = seq.state.tip()
    ready(w, 3)
    renew = seq._renew
    calls: list[int] = []

    def lost() -> None:
        calls.append(1)
        if len(calls) > 3:  # one per block, then the one before the commit
            raise StorageError("the chain lease was lost: another worker applies the chain now")
        renew()

    monkeypatch.setattr(seq, "_renew", lost)
    if seq.fuse:
        with pytest.raises(StorageError, match="lease was lost"):
            seq.advance()
        assert seq.state.tip() == before
        assert confirmed(seq.utxo) == confirmed_model(w.chain.txs[:-3], w.base)
    else:  # every block commits by itself as it is applied (each renewed the lease first)
        seq.advance()
        assert calls == [1, 1, 1]
    monkeypatch.setattr(seq, "_renew", renew)
    seq.advance()
    w.check()
