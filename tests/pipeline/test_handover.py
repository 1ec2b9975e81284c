"""No polling for the chain: a worker that finds the chain held leaves its block to the holder,
which looks at the chain once more after letting go (workers/chainstate/sequencer.py); the ids left
pending are swept once settled (workers/runtime/registry.py); a block is parsed once per process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chain import parse_block
from stores.blob import open_blob_store
from stores.state import BlockStatus, open_state_store
from tests.pipeline.chains import Chain, confirmed_model
from workers.chainstate.blockindex import INDEX_LEASE, Blocks, parsed_bytes
from workers.chainstate.sequencer import LEASE, ChainBusy, Sequencer, Unfinished, chain_at_rest
from workers.runtime.registry import BlockSettled, Registry


def other(seq: Sequencer, urls: tuple[str, str]) -> Sequencer:
    """A second worker on the same stores (its own state connection and lease holder id)."""
    return Sequencer(seq.utxo, open_state_store(urls[1]), seq.blobs)


def on_release(seq: Sequencer, then: Callable[[], None]) -> None:
    """Run `then` just before `seq` next lets go of the chain's lease (once): the moment a block
    indexed by another worker finds the lease held, after the holder's last look under it."""
    release = seq.state.release_lease
    fired: list[int] = []

    def hooked(name: str, holder: str) -> Any:
        if name == LEASE and not fired:
            fired.append(1)
            then()
        return release(name, holder)

    seq.state.release_lease = hooked  # type: ignore[method-assign]


def leaves_to_the_holder(b: Sequencer, raw: bytes, busy: list[bool]) -> None:
    """Another worker's block task: index the block, find the chain held, leave it (noted in
    `busy`)."""
    b.accept(b.store_block(raw))
    try:
        b.advance()
    except ChainBusy:
        busy.append(True)


def test_a_block_indexed_while_the_chain_is_held_is_applied_by_the_holder(
    seq: Sequencer, urls: tuple[str, str]
) -> None:
    c = Chain()
    for _ in range(3):
        c.add()
    seq.submit(c.blocks[0])
    b = other(seq, urls)
    try:
        busy: list[bool] = []
        seq.accept(seq.store_block(c.blocks[1]))
        on_release(seq, lambda: leaves_to_the_holder(b, c.blocks[2], busy))
        tip = seq.advance()
        assert busy == [True]  # the other worker did not apply it, nor wait for the chain
        assert tip is not None and tip.height == 3 and tip.hash == parse_block(c.blocks[2]).hash
        assert seq.state.get_block(tip.hash).status is BlockStatus.APPLIED  # type: ignore[union-attr]
        assert {(u.txid, u.vout) for u in seq.utxo.iter_utxos(confirmed=True)} == confirmed_model(c.txs)
    finally:
        b.state.close()


def test_the_ids_left_to_the_holder_go_once_settled(seq: Sequencer, urls: tuple[str, str]) -> None:
    """The holder removes the ids of the blocks its passes applied or refused, its own and those
    left to it; an orphan's id (no pass settles it) is removed by `utxo wait`'s check."""
    c = Chain()
    for _ in range(4):
        c.add()
    h = [parse_block(raw).hash_hex for raw in c.blocks]
    reg = Registry(seq.state)
    for x in h:
        reg.add(f"block:{x}")
    reg.add("tx:" + "ab" * 32)
    seq.submit(c.blocks[0])
    seq.accept(seq.store_block(c.blocks[1]))  # left to the holder by another worker
    seq.accept(seq.store_block(c.blocks[3]))  # an orphan: its parent has not arrived
    seq.advance()
    reg.done_blocks(seq.take_settled())
    assert reg.pending() == {f"block:{h[2]}", f"block:{h[3]}", "tx:" + "ab" * 32}
    assert seq.take_settled() == []
    settled = BlockSettled(seq.state)
    blocks = [f"block:{x}" for x in h]
    assert settled(blocks) == [blocks[0], blocks[1], blocks[3]]  # h[2]: not known yet
    assert settled(["tx:" + "ab" * 32]) == []
    seq.submit(c.blocks[2])  # the orphan connects: this pass applies both
    reg.done_blocks(seq.take_settled())
    assert reg.pending() == {"tx:" + "ab" * 32}
    assert seq.state.tip().height == 4  # type: ignore[union-attr]


def test_a_rebase_left_to_the_holder_is_carried_out(seq: Sequencer, urls: tuple[str, str]) -> None:
    """A block below the chain's base, indexed while the chain is held, notes a rebase without
    changing the best candidate: the chain is not at rest until the rebase is done."""
    c = Chain()
    for _ in range(4):
        c.add()
    seq.submit(c.blocks[1])  # the chain starts at the second block: the first is not known
    seq.submit(c.blocks[2])
    b = other(seq, urls)
    try:
        busy: list[bool] = []
        rest: list[bool] = []

        def arrives() -> None:
            leaves_to_the_holder(b, c.blocks[0], busy)  # below the base: a rebase is noted
            rest.append(chain_at_rest(b.state))

        seq.accept(seq.store_block(c.blocks[3]))
        on_release(seq, arrives)
        tip = seq.advance()
        assert busy == [True] and rest == [False]
        assert tip is not None and tip.height == 4 and chain_at_rest(seq.state)
        assert seq.state.counts() == {"applied": 4}
        assert {(u.txid, u.vout) for u in seq.utxo.iter_utxos(confirmed=True)} == confirmed_model(c.txs)
    finally:
        b.state.close()


def test_a_rebase_waits_for_the_index_lease(seq: Sequencer, urls: tuple[str, str]) -> None:
    """The holder never leaves a pass because another worker is indexing: it waits for the
    index lease (held for milliseconds) rather than leaving the rebase to no one."""
    c = Chain()
    for _ in range(3):
        c.add()
    seq.submit(c.blocks[1])
    seq.submit(c.blocks[2])
    seq.accept(seq.store_block(c.blocks[0]))  # a rebase is noted
    other_state = open_state_store(urls[1])
    assert other_state.acquire_lease(INDEX_LEASE, "another-worker", 30.0)
    timer = threading.Timer(0.3, other_state.release_lease, (INDEX_LEASE, "another-worker"))
    timer.start()
    try:
        tip = seq.advance()
        assert tip is not None and tip.height == 3 and seq.state.counts() == {"applied": 3}
    finally:
        timer.join()
        other_state.close()


def test_a_block_is_parsed_once_while_kept(tmp_path: Path) -> None:
    """Past the budget a block the chain has passed goes first, else the one furthest ahead
    (needed last); never the block being kept."""
    c = Chain()
    for _ in range(5):
        c.add()
    blobs = open_blob_store(f"file://{tmp_path}/blobs")
    blocks = Blocks(blobs, kept_blocks=3)  # blocks at heights 1…5: three kept
    h = [blocks.store(raw).hash for raw in c.blocks]  # a burst indexed ahead of the chain
    assert blocks.parses == 5
    for k in (0, 1, 4):  # the lowest (needed soonest) stayed, and the last one stored
        assert blocks.load(h[k]).hash == h[k]
    assert blocks.parses == 5
    blocks.passed(3)  # the chain is at the third: the first two are done with
    assert blocks.genuine(h[2]).hash == h[2] and blocks.parses == 6  # went (furthest ahead then)
    assert blocks.load(h[1]).hash == h[1] and blocks.load(h[4]).hash == h[4]
    assert blocks.parses == 6  # the first went for it (passed, least recently used)
    assert blocks.load(h[0]).hash == h[0] and blocks.parses == 7
    small = Blocks(blobs, kept_bytes=0)
    assert small.genuine(h[1]).hash == h[1] and small.load(h[1]).hash == h[1]
    assert small.parses == 1  # the block being kept stays, however small the budget
    by_size = Blocks(blobs, kept_bytes=2 * parsed_bytes(parse_block(c.blocks[0])))
    for k in (0, 1, 2):
        by_size.load(h[k])
    assert by_size.load(h[0]) and by_size.load(h[2]) and by_size.parses == 3  # two fit: the second went


def test_wait_returns_soon_after_the_last_id_goes(tmp_path: Path) -> None:
    """`utxo wait` reads the registry every poll; the settled check (reads per id) runs at once
    and then every `settle_every` seconds only."""
    state = open_state_store(f"sqlite:///{tmp_path}/state.db")
    other_state = open_state_store(f"sqlite:///{tmp_path}/state.db")
    reg, theirs = Registry(state), Registry(other_state)
    ids = [f"tx:{k:064x}" for k in range(3)]
    for i in ids:
        reg.add(i)
    asked: list[str] = []
    gone_at: list[float] = []

    def remove_all() -> None:
        for i in ids:
            time.sleep(0.3)
            theirs.done(i)
            gone_at.append(time.monotonic())

    def settled(idents: list[str]) -> list[str]:
        asked.extend(idents)
        return []

    worker = threading.Thread(target=remove_all)
    try:
        worker.start()
        assert reg.wait(30, settled=settled, settle_every=0.5)
        returned = time.monotonic()
        worker.join()
        assert returned - gone_at[-1] < 0.5  # by a poll, not by the settled check
        assert asked[:3] == ids  # once at the start, then every half second: never every poll
        assert 3 <= len(asked) <= 3 + 3 * 2
        reg.add("tx:" + "cd" * 32)
        assert not reg.wait(0.3, settled=settled)  # nothing removes it: the timeout answers
        assert reg.wait(5, settled=lambda ids: ids)  # settled anyway: taken off at once
        assert reg.pending() == set()
    finally:
        worker.join()
        state.close()
        other_state.close()


def burst(seq: Sequencer, urls: tuple[str, str]) -> tuple[Chain, Sequencer]:
    """Eight blocks, and a second worker that keeps four parsed."""
    c = Chain()
    for _ in range(8):
        c.add()
    b = other(seq, urls)
    b.blocks.kept_blocks = 4
    return c, b


def index_while_held(holder: Sequencer, b: Sequencer, raws: list[bytes]) -> None:
    """`b`'s block tasks for `raws` while `holder` holds the chain: each indexed and left."""
    with holder.lease() as mine:
        assert mine
        for raw in raws:
            b.accept(b.store_block(raw))
            with pytest.raises(ChainBusy):
                b.advance()


def test_a_worker_that_finds_the_chain_held_lets_the_applied_blocks_go_first(
    seq: Sequencer, urls: tuple[str, str]
) -> None:
    """A worker indexing a burst while another applies learns the holder's tip, so that past
    its budget the blocks already applied go, not the ones it will apply if it takes over."""
    c, b = burst(seq, urls)
    try:
        index_while_held(seq, b, c.blocks[:4])
        tip = seq.advance()  # the holder applies what b indexed
        assert tip is not None and tip.height == 4
        index_while_held(seq, b, c.blocks[4:])
        assert b.blocks.parses == 8
        tip = b.advance()  # b takes the chain over: what it kept is what it needs
        assert tip is not None and tip.height == 8 and b.state.counts() == {"applied": 8}
        assert b.blocks.parses == 8  # none parsed twice (before: 5, 6 and 7 went and came back)
        assert {(u.txid, u.vout) for u in b.utxo.iter_utxos(confirmed=True)} == confirmed_model(c.txs)
    finally:
        b.state.close()


def test_a_burst_indexed_ahead_keeps_its_highest_blocks_for_the_take_over(
    seq: Sequencer, urls: tuple[str, str]
) -> None:
    """A worker indexes a burst longer than its budget while another holds the chain (which has
    applied nothing yet): it keeps the highest blocks, since the holder applies the lowest
    before this worker can take over. Taking over after the holder's first five, it parses
    none twice (keeping the lowest, it would parse the sixth and seventh again)."""
    c, b = burst(seq, urls)
    try:
        index_while_held(seq, b, c.blocks)
        assert b.blocks.parses == 8
        for _ in range(5):  # the holder gets on, a block per budget, then hands the chain on
            with pytest.raises(Unfinished):
                seq.advance(budget_s=0)
        tip = seq.state.tip()
        assert tip is not None and tip.height == 5
        tip = b.advance()
        assert tip is not None and tip.height == 8 and b.state.counts() == {"applied": 8}
        assert b.blocks.parses == 8
        assert {(u.txid, u.vout) for u in b.utxo.iter_utxos(confirmed=True)} == confirmed_model(c.txs)
    finally:
        b.state.close()


def test_an_orphan_under_a_known_parent_is_never_settled(seq: Sequencer) -> None:
    """Issue 40: an orphan left under a parent that is in the index (a worker died between the
    parent's commit and its descendants') is not final: `utxo wait` must not call it done while
    the chain could still take it (it did, and returned 0 with the tip stuck below)."""
    c = Chain()
    for _ in range(3):
        c.add()
    h = [parse_block(raw).hash for raw in c.blocks]
    seq.submit(c.blocks[0])
    seq.accept(seq.store_block(c.blocks[2]))  # an orphan: its parent is unknown
    settled = BlockSettled(seq.state)
    orphan = f"block:{h[2][::-1].hex()}"
    assert settled([orphan]) == [orphan]  # final while its parent is unknown
    # its parent indexed and applied, the orphan left as it was (as a death between the two
    # commits leaves it): the chain is at rest, and the orphan still waits for no reason
    seq.blocks.store(c.blocks[1])
    first = seq.state.get_block(h[0])
    assert first is not None and first.work is not None
    seq.state.add_block(h[1], h[0], 2, first.work + 1, BlockStatus.PENDING, 1)
    seq.advance()
    tip, stuck = seq.state.tip(), seq.state.get_block(h[2])
    assert tip is not None and tip.hash == h[1] and stuck is not None and stuck.status is BlockStatus.ORPHAN
    assert settled([orphan]) == []
