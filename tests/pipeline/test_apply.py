"""The sequencer applying valid blocks, on every backend: orphans put in order, mempool
transactions that a block conflicts with, missing inputs allowed, transactions spanning several
records, and idempotence (a block twice; a block whose worker died half-way)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chain import Block, Tx, TxIn, parse_block
from chain.build import build_tx
from stores.blob import open_blob_store
from stores.state import BlockStatus, open_state_store
from stores.utxo import UtxoStore, open_utxo_store
from tests.pipeline.chains import Chain, confirmed, confirmed_model, script, spend
from tests.pipeline.world import World
from workers.chainstate.sequencer import APPLYING, LEASE, ChainBusy, Sequencer


@pytest.fixture
def w(seq: Sequencer) -> World:
    return World(seq)


def status(seq: Sequencer, raw: bytes) -> tuple[BlockStatus, int | None]:
    e = seq.state.get_block(parse_block(raw).hash)
    assert e is not None
    return e.status, e.height


# -- orphans -----------------------------------------------------------------------------------


def test_blocks_in_reverse_order_wait_as_orphans_then_apply_in_order(w: World) -> None:
    c = w.chain
    start = len(c.blocks)
    a = spend((w.funds[1], 0), n_outputs=2)
    c.add([a])
    c.add([spend((a, 0))])
    c.add()
    c.add([spend((a, 1)), spend((w.funds[2], 0))])
    c.add([spend((w.mined, 0))])
    new = c.blocks[start:]
    tip = w.seq.state.tip()
    for raw in reversed(new[1:]):
        e = w.seq.submit(raw)
        assert (e.status, e.height, e.work) == (BlockStatus.ORPHAN, None, None)
        assert w.seq.state.tip() == tip
        assert not w.seq.utxo.existing([t.txid for t in parse_block(raw).txs])
    e = w.seq.submit(new[0])
    assert e.status is BlockStatus.APPLIED
    assert [status(w.seq, r) for r in new] == [(BlockStatus.APPLIED, 1002 + i) for i in range(len(new))]
    w.check()
    for txs, h in zip(c.txs[start:], range(1002, 1007)):
        for t in txs:
            assert list(w.seq.utxo.get(t.txid, ["block_heights"]).block_heights) == [h]


def test_orphans_of_two_branches_apply_the_heavier_when_their_parent_arrives(w: World) -> None:
    x = w.chain.fork(len(w.chain.blocks) - 1)
    x_raw = x.add([spend((w.funds[1], 0))])
    a, b = x.fork(len(x.blocks) - 1), x.fork(len(x.blocks) - 1)
    b.add([spend((w.funds[2], 0))])
    b.add()
    for _ in range(3):
        a.add([spend((w.funds[2], 0), fee=123)] if len(a.blocks) == len(x.blocks) else None)
    order = [b.blocks[-1], a.blocks[-2], b.blocks[-2], a.blocks[-1], a.blocks[-3]]
    for raw in order:
        assert w.seq.submit(raw).status is BlockStatus.ORPHAN
    w.seq.submit(x_raw)
    w.check(a)
    assert all(status(w.seq, r)[0] in (BlockStatus.PENDING, BlockStatus.SIDE) for r in b.blocks[-2:])
    assert [status(w.seq, r)[1] for r in a.blocks[-3:]] == [1003, 1004, 1005]


def test_blocks_in_reverse_order_from_an_empty_chain(seq: Sequencer) -> None:
    c = Chain()
    for _ in range(5):
        c.add()
    for raw in reversed(c.blocks):
        seq.submit(raw)
    assert [status(seq, r) for r in c.blocks] == [(BlockStatus.APPLIED, h) for h in range(1, 6)]
    tip = seq.state.tip()
    assert tip is not None and tip.hash == c.parent
    assert confirmed(seq.utxo) == confirmed_model(c.txs)


def test_a_sibling_of_equal_work_waits_until_its_branch_is_heavier(w: World) -> None:
    side = w.chain.fork(len(w.chain.blocks) - 1)
    w.add([spend((w.funds[1], 0))])
    tip = w.seq.state.tip()
    e = w.seq.submit(side.add([spend((w.funds[1], 0), fee=10)]))
    assert e.status in (BlockStatus.SIDE, BlockStatus.PENDING) and e.height == 1002
    assert w.seq.state.tip() == tip  # a tie keeps the first seen
    w.check()
    w.seq.submit(side.add())
    w.check(side)


# -- the mempool -------------------------------------------------------------------------------


def test_a_block_that_double_spends_a_mempool_transaction(w: World) -> None:
    m = spend((w.funds[1], 0), (w.funds[2], 0), n_outputs=2)
    child = spend((m, 0))
    grandchild = spend((child, 0))
    other = spend((w.funds[3], 0))
    w.mempool(m, child, grandchild, other)
    a = spend((w.funds[1], 0), fee=5)  # the chain's tx: spends one of m's two inputs
    w.add([a])
    for t in (m, child, grandchild):
        meta = w.seq.utxo.get(t.txid, ["conflicting", "block_ids"])
        assert meta.conflicting and not meta.block_ids
    assert not any(w.seq.utxo.get(f.txid).locked for f in w.funds)  # the swap's locks are gone
    assert not w.seq.utxo.get(other.txid, ["conflicting"]).conflicting
    assert w.seq.utxo.get_output((w.funds[1].txid, 0)).spending_txid == a.txid  # type: ignore[union-attr]
    w.unspent([(w.funds[2].txid, 0)])  # m's spends were released...
    w.add([spend((w.funds[2], 0))])  # ...so the chain may spend its other input
    w.add([other])  # a mempool tx the chain mines: its record stays, now mined
    meta = w.seq.utxo.get(other.txid, ["block_heights", "unmined_since", "conflicting"])
    assert list(meta.block_heights) == [w.chain.height - 1] and meta.unmined_since is None
    assert w.seq.utxo.get_output((w.funds[3].txid, 0)).spending_txid == other.txid  # type: ignore[union-attr]


def test_a_conflict_swap_locks_the_parents_until_the_phase_is_over(w: World) -> None:
    """While a block's spend takes outputs from a mempool tx (made conflicting, its spends
    released), the parents of those outputs are locked: a mempool tx cannot take them
    meanwhile, the block's own spend goes through the lock, and the phase's end unlocks them
    (Teranode's ProcessConflicting: unspend with flagAsLocked, spend ignoring locked, unlock)."""
    from stores.utxo import SpendRejected, TxLocked
    from workers.chainstate.blockapply import BLOCK_SPEND

    m = spend((w.funds[1], 0), (w.funds[2], 0))
    w.mempool(m)
    applier, utxo = w.seq.applier, w.seq.utxo
    undo: dict[str, object] = {"created": []}
    applier._undo, applier._save = undo, None
    applier.make_conflicting([m.txid])
    assert undo["conflicted"] == [m.txid.hex()]
    assert sorted(undo["locked"]) == sorted(t.txid.hex() for t in (w.funds[1], w.funds[2]))  # type: ignore[arg-type]
    assert utxo.get(w.funds[1].txid).locked and utxo.get(w.funds[2].txid).locked
    thief = spend((w.funds[2], 0), fee=3)
    (r,) = utxo.spend_many([thief], w.chain.height)  # as a mempool tx would, meanwhile
    assert isinstance(r, SpendRejected) and isinstance(r.first, TxLocked)
    winner = spend((w.funds[1], 0), fee=5)
    utxo.create(winner, w.chain.height)
    assert utxo.spend(winner, w.chain.height, ignore=BLOCK_SPEND)[0].spending_txid == winner.txid
    applier.unlock_swapped()
    assert not utxo.get(w.funds[1].txid).locked and not utxo.get(w.funds[2].txid).locked


def test_advance_returns_at_once_while_another_worker_holds_the_chain(w: World) -> None:
    raw = w.chain.add([spend((w.funds[1], 0))])
    tip = w.seq.state.tip()
    assert w.seq.state.acquire_lease(LEASE, "another worker", 30)
    assert w.seq.accept(w.seq.store_block(raw)) is not None
    with pytest.raises(ChainBusy):
        w.seq.advance()
    assert w.seq.state.tip() == tip and status(w.seq, raw) == (BlockStatus.PENDING, 1002)
    w.seq.state.release_lease(LEASE, "another worker")
    after = w.seq.advance()
    assert after is not None and after.hash == parse_block(raw).hash
    w.check()


# -- missing inputs ----------------------------------------------------------------------------


def test_missing_inputs_refused_unless_allowed(w: World) -> None:
    x = build_tx([TxIn(b"\x66" * 32, 3, b"\x51", 0xFFFFFFFF), spend((w.funds[1], 0)).inputs[0]],
                 [(5 * 10**7, script()), (4 * 10**7, script())])
    w.refused(w.chain.next_block([x]), r"missing output", go_on=False)
    lax = Sequencer(w.seq.utxo, w.seq.state, w.seq.blobs, allow_missing_inputs=True)
    raw = w.chain.add([x])  # the same tx, in another block
    w.txs[x.txid] = x
    e = lax.submit(raw)
    assert e.status is BlockStatus.APPLIED and e.height == 1002
    w.check()  # the missing input changed nothing; the other one is spent
    assert w.seq.utxo.get_output((w.funds[1].txid, 0)).spending_txid == x.txid  # type: ignore[union-attr]
    w.add([spend((x, 1))])  # and the strict sequencer goes on from there


# -- transactions spanning several records -----------------------------------------------------


@pytest.fixture
def small(urls: tuple[str, str], tmp_path: Path) -> Iterator[Sequencer]:
    utxo = open_utxo_store(urls[0], blob_url=f"file://{tmp_path}/blobs", batch_size=4)
    state = open_state_store(urls[1])
    blobs = open_blob_store(f"file://{tmp_path}/blobs")
    assert utxo.batch_size == 4
    yield Sequencer(utxo, state, blobs)
    utxo.close()
    state.close()


def test_a_transaction_with_more_outputs_than_a_record_holds(small: Sequencer) -> None:
    w = World(small)
    big = spend((w.funds[1], 0), n_outputs=11)  # three records of at most 4 outputs
    kid = spend((big, 9), (big, 2))  # in the same block
    w.add([big, kid])
    assert w.seq.utxo.get(big.txid, ["total_extra_recs"]).total_extra_recs == 2
    w.add([spend((big, 0), (big, 5), (big, 10))])
    w.add([spend(*((big, v) for v in (1, 3, 4, 6, 7, 8)))])
    assert not any(t == big.txid for t, _v in confirmed(w.seq.utxo))


def test_a_refused_block_with_a_transaction_of_several_records(small: Sequencer) -> None:
    w = World(small)
    big = spend((w.funds[1], 0), n_outputs=9)
    bad = build_tx([TxIn(b"\x55" * 32, 0, b"\x51", 0xFFFFFFFF)], [(1, script())])
    w.refused(w.chain.next_block([big, spend((big, 8)), bad]), r"missing output", go_on=False)
    w.add([big])  # created again from nothing
    w.add([spend((big, 8), (big, 4))])


# -- idempotence and recovery ------------------------------------------------------------------


def test_the_same_block_twice_changes_nothing(w: World) -> None:
    w.add([spend((w.funds[1], 0))])
    w.add()
    before = (w.seq.state.counts(), w.seq.state.tip(), confirmed(w.seq.utxo), w.seq.utxo.stats())
    for raw in (w.chain.blocks[-1], w.chain.blocks[-2], w.chain.blocks[0]):
        e = w.seq.submit(raw)
        assert e.status is BlockStatus.APPLIED
        assert (w.seq.state.counts(), w.seq.state.tip(), confirmed(w.seq.utxo), w.seq.utxo.stats()) == before
    bad = w.chain.next_block([spend((w.funds[0], 0), fee=1)])
    first = w.seq.submit(bad)
    assert first.status is BlockStatus.INVALID
    assert w.seq.submit(bad) == first
    w.check()


def _half_apply(seq: Sequencer, block: Block, stage: str) -> None:
    """What a worker that died at `stage` leaves behind."""
    e = seq.accept(block)
    assert e is not None and e.height is not None and e.status is BlockStatus.PENDING
    undo = seq.applier.plan(block) | {"state": "applying", "block_id": e.block_id, "height": e.height}
    seq.state.put_undo(block.hash, undo)
    seq.state.set_meta(APPLYING, block.hash.hex())
    created = {bytes.fromhex(h) for h in undo["created"]}
    ctx = {"height": e.height, "block_id": e.block_id}
    seq.applier.create_phase(block, created, ctx)
    if stage in ("spent", "mined"):
        seq.applier.spend_phase(block, created, ctx)
    if stage == "mined":
        seq.applier.mine_phase(block, ctx)
        seq.utxo.set_block_height(e.height)


STAGES = ["created", "spent", "mined"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_half_applied_block_is_taken_back_and_applied(w: World, stage: str) -> None:
    m = spend((w.funds[2], 0))  # a mempool tx the block mines: kept by the take-back
    w.mempool(m)
    a = spend((w.funds[1], 0), n_outputs=2)
    b = spend((a, 0))
    raw = w.chain.add([a, b, m])
    w.txs.update((t.txid, t) for t in w.chain.txs[-1])
    block = w.seq.store_block(raw)
    _half_apply(w.seq, block, stage)
    assert m.txid.hex() not in (w.seq.state.get_undo(block.hash) or {})["created"]
    again = Sequencer(w.seq.utxo, w.seq.state, w.seq.blobs)  # another worker, later
    tip = again.advance()
    assert tip is not None and tip.hash == block.hash and tip.status is BlockStatus.APPLIED
    w.check()
    assert (w.seq.state.get_undo(block.hash) or {}).get("state") == "applied"
    for t in (a, b, m):
        meta = w.seq.utxo.get(t.txid, ["block_heights", "unmined_since"])
        assert list(meta.block_heights) == [1002] and meta.unmined_since is None
    spent_by = {(w.funds[1].txid, 0): a.txid, (w.funds[2].txid, 0): m.txid, (a.txid, 0): b.txid}
    outs = w.seq.utxo.get_outputs(list(spent_by))
    assert {op: o.spending_txid for op, o in outs.items()} == spent_by
    w.add([spend((a, 1), (b, 0))])


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("conflict", [False, True], ids=["apart", "double-spending"])
def test_a_half_applied_block_that_a_heavier_branch_replaced(w: World, stage: str, conflict: bool) -> None:
    """The worker died; meanwhile a heavier sibling branch arrived. The half-applied block is not
    on the best chain: whatever it did must not count on it (nor refuse the branch)."""
    side = w.chain.fork(len(w.chain.blocks) - 1)
    a = spend((w.funds[1], 0))
    block = w.seq.store_block(w.chain.next_block([a]))
    _half_apply(w.seq, block, stage)
    again = Sequencer(w.seq.utxo, w.seq.state, w.seq.blobs)
    side.add([spend((w.funds[1 if conflict else 2], 0), fee=77)])
    side.add()
    for raw in side.blocks[-2:]:
        assert again.accept(again.store_block(raw)) is not None
    tip = again.advance()
    assert tip is not None and tip.hash == side.parent
    assert [status(w.seq, r)[0] for r in side.blocks[-2:]] == [BlockStatus.APPLIED] * 2
    w.check(side)


def test_a_conflict_swap_whose_mempool_tx_lost_a_parent(w: World) -> None:
    """The mempool tx a block conflicts with spent an output of a tx that is gone since (here a
    tx of a block that was then refused and taken back): the swap locks and unlocks only the
    parents there are, and the block is applied."""
    gone = spend((w.funds[1], 0))
    w.mempool(gone)
    m = spend((gone, 0), (w.funds[2], 0))
    w.mempool(m)
    w.seq.applier.release([gone])  # what taking back its block does
    assert w.seq.utxo.delete_txs([gone.txid]) == 1
    w.add([spend((w.funds[2], 0), fee=5)])
    assert w.seq.utxo.get(m.txid).conflicting
    assert not w.seq.utxo.get(w.funds[2].txid).locked


# -- one write transaction per block (SQLite) -------------------------------------------------


def test_a_block_is_fused_unless_the_state_store_shares_its_sqlite_file(tmp_path: Path) -> None:
    """With the state store in the UTXO store's SQLite file, the state store's writes during a
    block (the undo notes of a conflict swap) would wait for the block's own transaction: such
    a block is applied unit by unit, and a conflict swap goes through."""
    blobs = open_blob_store(f"file://{tmp_path}/blobs")
    one = f"sqlite:///{tmp_path}/one.db"
    apart = Sequencer(open_utxo_store(f"sqlite:///{tmp_path}/u.db"), open_state_store(f"sqlite:///{tmp_path}/s.db"),
                      blobs)
    shared = Sequencer(open_utxo_store(one), open_state_store(one), blobs)
    try:
        assert apart.fuse and not shared.fuse
        w = World(shared)
        m = spend((w.funds[1], 0))
        w.mempool(m)
        w.add([spend((w.funds[1], 0), fee=5)])  # a swap: m conflicting, noted in the undo record
        assert w.seq.utxo.get(m.txid, ["conflicting"]).conflicting
    finally:
        for s in (apart, shared):
            s.utxo.close()
            s.state.close()


def arrives_after_the_plan(seq: Sequencer, other: UtxoStore, tx: Tx, height: int) -> None:
    """Another worker (`other`) creates `tx` and spends its inputs, as the transaction pipeline
    does, right after `seq`'s next block plan has read the store."""
    plan = seq.applier.plan

    def plan_then_tx_arrives(block: Block) -> dict[str, object]:
        undo = plan(block)
        other.create(tx, height)
        other.spend(tx, height)
        return undo

    seq.applier.plan = plan_then_tx_arrives  # type: ignore[method-assign]


def test_a_parent_created_between_the_plan_and_the_checks_is_seen(
    seq: Sequencer, urls: tuple[str, str], tmp_path: Path
) -> None:
    """A tx worker creates (and spends into) a mempool tx just after the block's plan read the
    store, before the block's write transaction: a block spending it is still refused, as
    one that arrived after it would be (the plan's read is handed to the checks, which read
    again what it did not find)."""
    w = World(seq)
    other = open_utxo_store(urls[0], blob_url=f"file://{tmp_path}/blobs")  # another worker's
    try:
        m = spend((w.funds[1], 0))
        raw = w.chain.next_block([spend((w.funds[2], 0)), spend((m, 0))])
        arrives_after_the_plan(seq, other, m, w.chain.height - 1)
        e = seq.submit(raw)
        assert e.status is BlockStatus.INVALID and "not mined on this chain" in (e.reason or ""), e
        assert seq.utxo.existing([m.txid]) == {m.txid}  # the mempool tx stays, unmined
        assert not seq.utxo.mined([m.txid])
    finally:
        other.close()


def test_a_block_tx_created_by_another_worker_after_the_plan_outlives_a_refusal(
    seq: Sequencer, urls: tuple[str, str], tmp_path: Path
) -> None:
    """The plan found a tx of the block new; a tx worker created it (from the mempool) before
    the create phase; the block is then refused: the take-back leaves that record, which the
    block did not make."""
    w = World(seq)
    other = open_utxo_store(urls[0], blob_url=f"file://{tmp_path}/blobs")  # another worker's
    try:
        m = spend((w.funds[1], 0))
        nowhere = TxIn(b"\x77" * 32, 0, b"\x51", 0xFFFFFFFF)
        raw = w.chain.next_block([m, build_tx([nowhere], [(1, script())])])  # refused: spends nothing
        arrives_after_the_plan(seq, other, m, w.chain.height - 1)
        e = seq.submit(raw)
        assert e.status is BlockStatus.INVALID and "missing output" in (e.reason or ""), e
        assert seq.utxo.existing([m.txid]) == {m.txid}  # the mempool tx stays, unmined
        assert not seq.utxo.mined([m.txid])
        assert seq.utxo.get_outputs([(w.funds[1].txid, 0)])[(w.funds[1].txid, 0)].spending_txid == m.txid
    finally:
        other.close()
