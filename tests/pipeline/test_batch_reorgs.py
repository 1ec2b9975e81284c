"""Reorgs whose fork point lies inside a batch (`workers.chainstate.batch`): blocks that were applied
together (one UTXO-store transaction on SQLite, one state-store step) are not taken off the
chain together — a heavier branch forking from the middle of the batch disconnects only the
blocks above its fork point, each by itself, and comes in as a batch of its own. A worker that
dies at any point of that reorg (before or after any block leaves or joins the chain) leaves the
next pass to finish it. Random block trees whose blocks arrive in parts, each part applied in one
pass, put fork points inside batches at random places. Every result is checked against the
model (`tests.pipeline.world`, `tests.pipeline.trees`), which knows nothing of batches."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chain import Tx, parse_block
from stores.blob import open_blob_store
from stores.errors import StorageError
from stores.state import BlockStatus, open_state_store
from stores.utxo import open_utxo_store
from tests.pipeline.chains import spend
from tests.pipeline.conftest import drop_tables
from tests.pipeline.test_batches import finishes
from tests.pipeline.trees import check_store, make_tree
from tests.pipeline.world import World
from workers.chainstate.sequencer import APPLYING, Sequencer
from workers.demo.demochain import Branch

MAIN = 6  # blocks of the batch the branch forks inside
FORK = 2  # the branch follows the batch's second block
SIDE = 5  # the branch's blocks: heavier than the batch by one


def accept_all(seq: Sequencer, raws: list[bytes]) -> None:
    """The blocks stored and indexed, none applied: the next pass finds them all ready."""
    for raw in raws:
        seq.accept(seq.store_block(raw))


@dataclass
class Fork:
    main: Branch
    side: Branch
    y: Tx  # mined in the batch above the fork point
    y2: Tx  # the branch's double spend of y's input


def batch_then_fork(w: World) -> Fork:
    """A batch of MAIN blocks applied in one pass, then a branch of SIDE blocks forking after its
    FORK-th block, stored and indexed. The batch makes a and x below the fork point (both
    branches spend them, a's output 1 each its own way) and mines y above it (the branch
    double-spends y's input)."""
    at = len(w.chain.blocks) - 1
    a = spend((w.funds[1], 0), n_outputs=3)
    x = spend((a, 0))
    y = spend((w.funds[2], 0))
    for txs in ([a], [x], [y], [spend((a, 1))], [spend((x, 0))], [spend((w.funds[3], 0))]):
        w.chain.add(txs)
    accept_all(w.seq, w.chain.blocks[-MAIN:])
    w.seq.advance()
    w.check()
    side = w.chain.fork(at + FORK)
    y2 = spend((w.funds[2], 0), fee=2000)
    for txs in ([y2], [spend((a, 1), fee=3000)], [spend((a, 2))], [spend((y2, 0))], []):
        side.add(txs)
    accept_all(w.seq, side.blocks[-SIDE:])
    return Fork(w.chain, side, y, y2)


def batches_seen(seq: Sequencer, monkeypatch: pytest.MonkeyPatch) -> list[list[bytes]]:
    """The blocks of each state-store step of applied blocks (a batch), as they commit."""
    seen: list[list[bytes]] = []
    real = seq._finish

    def noted(done: list[Any], still: list[bytes] | None = None) -> None:
        real(done, still)
        seen.append([a.entry.hash for a in done])

    monkeypatch.setattr(seq, "_finish", noted)
    return seen


def statuses(seq: Sequencer, raws: list[bytes]) -> list[BlockStatus]:
    out = []
    for raw in raws:
        e = seq.state.get_block(parse_block(raw).hash)
        assert e is not None
        out.append(e.status)
    return out


def test_a_branch_forking_inside_a_batch_takes_over_and_gives_back(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(seq)
    seen = finishes(seq, monkeypatch)
    f = batch_then_fork(w)
    assert seen == ([MAIN] if seq.fuse else [1] * MAIN)
    seen.clear()
    seq.advance()
    w.chain = f.side
    w.check()
    assert seen == ([SIDE] if seq.fuse else [1] * SIDE)
    above = f.main.blocks[-(MAIN - FORK):]
    assert statuses(seq, above) == [BlockStatus.SIDE] * len(above)
    assert statuses(seq, f.main.blocks[-MAIN:-(MAIN - FORK)]) == [BlockStatus.APPLIED] * FORK
    assert seq.utxo.get(f.y.txid, ["conflicting"]).conflicting
    # and back: the batch's branch grows heavier again, its blocks above the fork return
    for _ in range(2):
        f.main.add()
    accept_all(seq, f.main.blocks[-2:])
    seq.advance()
    w.chain = f.main
    w.check()
    assert statuses(seq, f.side.blocks[-SIDE:]) == [BlockStatus.SIDE] * SIDE
    assert not seq.utxo.get(f.y.txid, ["conflicting"]).conflicting
    assert seq.utxo.get(f.y2.txid, ["conflicting"]).conflicting
    assert seq.state.get_meta(APPLYING) is None


# Every step of the reorg, in order: the batch's blocks above the fork leave the chain (the
# last first), then the branch's join it; the worker dies as a step starts or just after it
# did its UTXO-store part (before its state-store step).
STEPS = [("disconnect", k) for k in range(MAIN - FORK)] + [("apply", k) for k in range(SIDE)]


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("step", range(len(STEPS)), ids=[f"{s}{k}" for s, k in STEPS])
def test_a_worker_dying_at_any_step_of_a_reorg_inside_a_batch(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch, step: int, when: str
) -> None:
    w = World(seq)
    f = batch_then_fork(w)
    kind, k = STEPS[step]
    real: Callable[..., Any] = getattr(seq.applier, kind)
    calls: list[int] = []

    def dies(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == k + 1:
            if when == "after":
                real(*a, **kw)
            raise StorageError("the worker died here")
        return real(*a, **kw)

    monkeypatch.setattr(seq.applier, kind, dies)
    with pytest.raises(StorageError, match="died here"):
        seq.advance()
    monkeypatch.setattr(seq.applier, kind, real)
    tip = seq.state.tip()
    assert tip is not None and tip.height is not None
    assert f.side.height - 1 - SIDE <= tip.height <= f.main.height - 1  # never above either
    seq.advance()  # the next pass (this process, as the next holder would) finishes the reorg
    w.chain = f.side
    w.check()
    assert seq.state.get_meta(APPLYING) is None
    assert seq.utxo.get(f.y.txid, ["conflicting"]).conflicting


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("seed", [3, 15, 18, 29, 45, 49])
def test_random_trees_arriving_in_parts_fork_inside_batches(
    seed: int, backend: str, request: pytest.FixtureRequest
) -> None:
    """A random tree (`tests.pipeline.trees`) whose blocks arrive in three parts, each part
    stored and indexed whole and then applied in one pass: the blocks of a part that are ready
    go as one batch, and a later part's heavier branch forks inside it."""
    tree = make_tree(seed, max_len=10)
    with tempfile.TemporaryDirectory() as d:
        if backend == "postgresql":
            pg: str = request.getfixturevalue("pg_url")
            drop_tables(pg)
            urls = (pg, pg)
        else:
            urls = (f"sqlite:///{d}/utxo.db", f"sqlite:///{d}/state.db")
        blobs = f"file://{Path(d)}/blobs"
        utxo = open_utxo_store(urls[0], blob_url=blobs)
        tree.seed(utxo)
        seq = Sequencer(utxo, open_state_store(urls[1]), open_blob_store(blobs))
        batches = batches_seen(seq, request.getfixturevalue("monkeypatch"))
        left: list[bytes] = []
        real = seq._disconnect
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setattr(seq, "_disconnect", lambda e: (left.append(e.hash), real(e)))
        try:
            for part in tree.parts():
                accept_all(seq, part)
                seq.advance()
            check_store(tree, seq.utxo, seq.state)
            assert seq.state.get_meta(APPLYING) is None
            if seq.fuse:  # the seeds are those whose trees fork inside a batch
                split = [b for b in batches if set(b) & set(left) and set(b) - set(left)]
                assert split, ([len(b) for b in batches], len(left))
        finally:
            seq.utxo.close()
            seq.state.close()
