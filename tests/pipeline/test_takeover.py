"""Outputs held by a spender with no record, on every backend (Aerospike with AEROSPIKE_HOSTS):
a mempool tx between its spend and its record, or one whose attempt died between two of its
parents' records and whose delivery was then refused. A block spending such an output takes it
over at once (it used to wait for a record that, for a dead attempt, never came); the mempool
side, making its record after that, finds the input lost and is made conflicting, or spends it
again when it was only freed. Checked against the chain's model (`World.check`)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from chain import Tx
from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.state.recovery import RecoveryEntry
from stores.utxo import BlockInfo, SpendRejected, TxConflicting, UtxoSpent, open_utxo_store
from stores.utxo.values import Spend
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.pipeline.chains import confirmed_model, funding, outpoints, spend
from tests.pipeline.conftest import drop_tables
from tests.pipeline.workers import Pipeline, children, faults, pipeline_fixture, until  # noqa: F401
from tests.pipeline.world import World
from workers.chainstate.blockapply import BlockApplier
from workers.chainstate.conflicts import Conflicts
from workers.chainstate.mempool import apply_tx, hold_inputs, make_record, waiting_for_parents
from workers.chainstate.sequencer import Sequencer
from workers.recovery.handlers import handle
from workers.settings import Settings

Outpoint = tuple[bytes, int]


@pytest.fixture(params=["sqlite", "postgresql", pytest.param("aerospike", marks=needs_aerospike)])
def seq(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sequencer]:
    state_url = f"sqlite:///{tmp_path}/state.db"
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/utxo.db"
    elif request.param == "postgresql":
        url = state_url = request.getfixturevalue("pg_url")
        drop_tables(url)
    else:
        url = new_url()
    utxo = open_utxo_store(url, blob_url=f"file://{tmp_path}/blobs")
    state = open_state_store(state_url)
    yield Sequencer(utxo, state, open_blob_store(f"file://{tmp_path}/blobs"))
    utxo.close()
    state.close()
    if request.param == "aerospike":
        drop_set(None, url)


def spender(w: World, op: Outpoint) -> bytes | None:
    return w.seq.utxo.get_outputs([op])[op].spending_txid


def dead_attempt(w: World, m_ops: list[Outpoint], kept: set[int]) -> Tx:
    """The state a delivery of m leaves when it is killed after its calls on the records of
    `m_ops[k]` for k in `kept` and before the others (on a store whose spend is not one unit
    across records; on SQL, killed between its spend and its record, then a block took the
    others over): m holds those outputs alone, and has no record. Returns m."""
    utxo = w.seq.utxo
    m = spend(*[(w.txs[t], v) for t, v in m_ops])
    w.txs[m.txid] = m
    (spent,) = utxo.spend_many([m], utxo.current_height() + 1)
    assert isinstance(spent, list)
    others = [s for s in spent if s.spending_vin not in kept]
    assert utxo.unspend(others) == [None] * len(others)
    return m


def test_a_dead_attempt_neither_stalls_a_block_nor_outlives_its_refused_delivery(
    seq: Sequencer,
) -> None:
    """m's attempt died holding o1 and o3; a rival r took o2. A block mining x, which spends
    o1, is applied at once (o1 taken over from m, which has no record). m's next delivery is
    refused (o1 is x's, o2 r's) and frees o3, the last thing it held; m never has a record."""
    w = World(seq)
    o1, o2, o3 = (w.funds[1].txid, 0), (w.funds[2].txid, 0), (w.funds[3].txid, 0)
    m = dead_attempt(w, [o1, o2, o3], kept={0, 2})
    assert seq.utxo.spenders([o1, o2, o3]) == {o1: m.txid, o2: None, o3: m.txid}
    r = spend((w.funds[2], 0), fee=3000)
    assert apply_tx(seq.utxo, r) is True
    x = spend((w.funds[1], 0), fee=2000)
    w.add([x])  # applied at once, and the confirmed set is the model's
    assert seq.utxo.spenders([o1, o3]) == {o1: x.txid, o3: m.txid}
    refused = apply_tx(seq.utxo, m)  # the delivery again: refused for good
    assert isinstance(refused, SpendRejected)
    assert {type(e) for _v, e in refused.errors} == {UtxoSpent}
    assert seq.utxo.spenders([o3]) == {o3: None} and not seq.utxo.existing([m.txid])
    assert not seq.utxo.get(r.txid).conflicting  # the rival of the dead attempt is untouched
    y = spend((w.funds[3], 0), fee=4000)
    assert apply_tx(seq.utxo, y) is True  # o3 is anyone's again
    w.add([r, y])
    assert seq.utxo.mined([r.txid, x.txid, y.txid]) == {r.txid, x.txid, y.txid}


def test_a_refused_delivery_frees_what_its_dead_attempt_held(seq: Sequencer) -> None:
    """Without a block: m's attempt died holding o1; r took o2; m's delivery, refused, frees
    o1 at once, and a tx spending o1 is accepted."""
    w = World(seq)
    o1, o2 = (w.funds[1].txid, 0), (w.funds[2].txid, 0)
    m = dead_attempt(w, [o1, o2], kept={0})
    r = spend((w.funds[2], 0), fee=3000)
    assert apply_tx(seq.utxo, r) is True
    assert isinstance(apply_tx(seq.utxo, m), SpendRejected)
    assert seq.utxo.spenders([o1, o2]) == {o1: None, o2: r.txid}
    z = spend((w.funds[1], 0), fee=3000)
    assert apply_tx(seq.utxo, z) is True
    w.add([r, z])


def test_a_mempool_tx_whose_record_comes_after_a_block_took_its_input_is_conflicting(
    seq: Sequencer,
) -> None:
    """m spent o1 and o2, then a block mining x (spending o1) came before m's record: the
    block is applied at once. m's record, made then, finds o1 lost: m is conflicting, and o2
    is free again (a mempool tx may take it)."""
    w = World(seq)
    o1, o2 = (w.funds[1].txid, 0), (w.funds[2].txid, 0)
    m = spend((w.funds[1], 0), (w.funds[2], 0))
    height = seq.utxo.current_height()
    (spent,) = seq.utxo.spend_many([m], height + 1)  # the first half of `apply_tx`
    assert isinstance(spent, list)
    x = spend((w.funds[1], 0), fee=2000)
    w.add([x])
    assert spender(w, o1) == x.txid and spender(w, o2) == m.txid
    lost = make_record(seq.utxo, m, height)  # the second half
    assert isinstance(lost, TxConflicting) and "lost an input" in str(lost)
    assert f"is already spent by {x.txid_hex}" in str(lost)  # (the spend again names x)
    assert seq.utxo.get(m.txid).conflicting
    assert spender(w, o2) is None
    y = spend((w.funds[2], 0), fee=5000)
    assert apply_tx(seq.utxo, y) is True
    w.check()


def test_a_record_made_before_the_block_looked_again_is_made_conflicting_by_the_block(
    seq: Sequencer,
) -> None:
    """The other order: the block found no record for m, m's record was made (and checked
    its inputs, still all its own) before the block freed o1. The block looks again after
    freeing, finds the record and makes m conflicting, its other spends released."""
    w = World(seq)
    o1, o2 = (w.funds[1].txid, 0), (w.funds[2].txid, 0)
    m = spend((w.funds[1], 0), (w.funds[2], 0))
    assert apply_tx(seq.utxo, m) is True
    applier = BlockApplier(seq.utxo)
    applier.take_over(m.txid, [o1])
    assert seq.utxo.get(m.txid).conflicting
    assert spender(w, o1) is None and spender(w, o2) is None
    assert seq.utxo.get(w.funds[1].txid).locked  # until the block's spend phase is over
    applier.take_over(m.txid, [o1])  # again: nothing held, nothing changes
    assert seq.utxo.get(m.txid).conflicting and spender(w, o2) is None


def test_an_input_freed_before_the_record_is_spent_again(seq: Sequencer) -> None:
    """m's input was freed between its spend and its record and nobody took it (a refused
    delivery of m beside this one took back its own new spend): making the record spends it
    again, and m is a normal mempool tx."""
    w = World(seq)
    o1 = (w.funds[1].txid, 0)
    m = spend((w.funds[1], 0), (w.funds[2], 0))
    height = seq.utxo.current_height()
    (spent,) = seq.utxo.spend_many([m], height + 1)
    assert isinstance(spent, list)
    first = next(s for s in spent if (s.txid, s.vout) == o1)
    assert seq.utxo.unspend([Spend(first.txid, first.vout, first.utxo_hash, m.txid, 0)]) == [None]
    assert make_record(seq.utxo, m, height) is True
    assert spender(w, o1) == m.txid and not seq.utxo.get(m.txid).conflicting
    assert make_record(seq.utxo, m, height) is False  # a redelivery: known, nothing changes
    w.add([m])



def lost_after_its_record(seq: Sequencer) -> tuple[World, Tx, Tx]:
    """m spent funds[1]:0 and funds[2]:0; a block mining x took the first over; then m's record
    was made, and the check after it lost with its worker. (world, m, x)"""
    w = World(seq)
    m = spend((w.funds[1], 0), (w.funds[2], 0))
    height = seq.utxo.current_height()
    (spent,) = seq.utxo.spend_many([m], height + 1)
    assert isinstance(spent, list)
    x = spend((w.funds[1], 0), fee=2000)
    w.add([x])
    (made,) = seq.utxo.create_many([m], height)
    assert not isinstance(made, Exception)
    return w, m, x


def test_a_refused_delivery_of_a_tx_with_a_record_that_lost_an_input(seq: Sequencer) -> None:
    """m's record was made, but the check after it never ran (its worker failed there, the
    task is tried again) while a block took o1 over. The delivery again is refused (o1 is x's):
    m, which has a record, is made conflicting and o2 is freed (found by review: it stayed
    unmarked, holding o2 for good)."""
    w, m, x = lost_after_its_record(seq)
    o1, o2 = (w.funds[1].txid, 0), (w.funds[2].txid, 0)
    refused = apply_tx(seq.utxo, m)
    assert isinstance(refused, SpendRejected)
    assert seq.utxo.get(m.txid).conflicting
    assert seq.utxo.spenders([o1, o2]) == {o1: x.txid, o2: None}
    w.check()


def test_an_input_a_blocks_swap_holds_locked_is_waited_for(seq: Sequencer) -> None:
    """m's record is made while a block's take-over holds o1 freed, its parent locked: m's
    check cannot spend it again yet, and says so with a refusal that passes (TxLocked: the
    task tries again), m unchanged. The block's phase is then refused (its locks undone): the
    retry finds o1 free and m whole, not conflicting (found by review: m was made
    conflicting, which a refused block does not undo)."""
    w = World(seq)
    o1, o2 = (w.funds[1].txid, 0), (w.funds[2].txid, 0)
    m = spend((w.funds[1], 0), (w.funds[2], 0))
    height = seq.utxo.current_height()
    (spent,) = seq.utxo.spend_many([m], height + 1)
    assert isinstance(spent, list)
    BlockApplier(seq.utxo).take_over(m.txid, [o1])  # m has no record: nothing else happens
    assert seq.utxo.spenders([o1, o2]) == {o1: None, o2: m.txid}
    waiting = make_record(seq.utxo, m, height)
    assert isinstance(waiting, SpendRejected) and waiting_for_parents(waiting)
    assert not seq.utxo.get(m.txid).conflicting
    seq.utxo.set_locked([w.funds[1].txid], False)  # the block refused: its swap undone
    assert apply_tx(seq.utxo, m) is False  # the task again: known, and whole
    assert seq.utxo.spenders([o1, o2]) == {o1: m.txid, o2: m.txid}
    assert not seq.utxo.get(m.txid).conflicting

@pytest.mark.timeout(180)
def test_a_worker_killed_between_a_txs_spend_and_its_record(pipeline: Pipeline) -> None:
    """Real workers: w1 is killed (SIGKILL) after spending m's inputs o1 and o2, before m's
    record. A block mining x, which spends o1, is applied by w2 while m's message still waits
    to be sent again (it used to wait for m's record). Sent again (w3's re-sending scan), m is
    refused (o1 is x's) and frees o2; m never has a record, and o2 is spent by no one."""
    funds = funding(3)
    chain = pipeline.seed(funds)
    marker = pipeline.tmp / "parked"
    park = faults("tx_spent", marker)
    pipeline.start_worker("w1", env=park)
    m = spend((funds[0], 0), (funds[1], 0))
    pipeline.enqueue("tx", [m.raw])
    text = until(lambda: marker.exists() and marker.read_text(), 60, 0.05, "w1 parked after m's spend")
    w1 = pipeline.workers[0]
    assert int(text.split()[0]) in children(w1.pid)
    os.killpg(w1.pid, signal.SIGKILL)
    w1.wait()
    quiet = {"UTXO_REQUEUE_AFTER": "3600", "UTXO_RECOVERY_ENABLED": "false"}  # m stays unsent
    pipeline.start_worker("w2", env=quiet)
    x = spend((funds[0], 0), fee=2000)
    chain.add([x])
    pipeline.enqueue("block", chain.blocks)
    until(lambda: pipeline.tip()["height"] == 1001, 60, 0.1, "the block applied, m still unsent")
    store = pipeline.open_utxo()
    try:
        o1, o2 = (funds[0].txid, 0), (funds[1].txid, 0)
        assert store.spenders([o1, o2]) == {o1: x.txid, o2: m.txid} and not store.existing([m.txid])
        pipeline.start_worker("w3", env={"UTXO_REQUEUE_AFTER": "1", "UTXO_REQUEUE_INTERVAL": "1"})
        (said,) = pipeline.wait(refused=1)["refusals"]  # m, with x holding o1
        assert said["key"] == m.txid_hex and said["rival"] == x.txid_hex, said
        assert store.spenders([o1, o2]) == {o1: x.txid, o2: None} and not store.existing([m.txid])
    finally:
        store.close()
    assert pipeline.confirmed() == confirmed_model(chain.txs, outpoints(funds))
    later = pipeline.log("w2") + pipeline.log("w3")  # (w3's scan sent it; either took it)
    assert f"tx {m.txid_hex} rejected" in later and "Traceback" not in later, pipeline.logs()


def entry(t: Tx, stored_at: float) -> RecoveryEntry:
    """A pending recovery entry of `t`, added at `stored_at`, never checked nor accepted."""
    return RecoveryEntry(f"tx:{t.txid_hex}", "tx", t.txid_hex, "pending", stored_at, 0, "", 0, 0, False, "")


def test_the_recovery_manager_checks_an_unmined_records_inputs(seq: Sequencer, tmp_path: Path) -> None:
    """m's record was made, its check cut short, and a block took o1 over meanwhile: the
    recovery manager's next look at m's entry finds the input lost, and m conflicting, its
    other spend released (found by review: it said "unmined" for ever)."""
    w, m, x = lost_after_its_record(seq)
    o1, o2 = (w.funds[1].txid, 0), (w.funds[2].txid, 0)
    svc = SimpleNamespace(utxo=seq.utxo, blobs=seq.blobs, state=seq.state, settings=Settings())
    verdict = handle(svc, entry(m, time.time()))  # type: ignore[arg-type]
    # checked again until the grace has passed (a block may yet mine m), then deleted
    assert verdict.status == "pending" and verdict.outcome.startswith("conflicting: checked again"), verdict
    assert seq.utxo.get(m.txid).conflicting
    later = handle(svc, entry(m, time.time() - 3600))  # type: ignore[arg-type]
    assert later.status == "deleted" and later.outcome.startswith("deleted: conflicting"), later
    assert seq.utxo.spenders([o1, o2]) == {o1: x.txid, o2: None}
    w.check()


def test_an_orphan_frees_what_its_dead_attempt_held(seq: Sequencer) -> None:
    """m's attempt died holding o1, and its other parent never came: every delivery waits
    for it. Once the recovery manager calls m `orphan`, o1 is freed (found by review: it was
    held for good)."""
    w = World(seq)
    o1 = (w.funds[1].txid, 0)
    ghost = spend((w.funds[2], 0))  # never sent: m's parent the store never sees
    m = spend((w.funds[1], 0), (ghost, 0))
    (spent,) = seq.utxo.spend_many([m], seq.utxo.current_height() + 1, missing_ok=True)
    assert isinstance(spent, list) and [s.txid for s in spent] == [o1[0]]  # (its attempt)
    ident = f"tx:{m.txid_hex}"  # its bytes kept with its registration, as `utxo enqueue` keeps them
    seq.state.add_pending_many([(ident, "tx", m.txid_hex)], "run", {ident: m.raw})
    svc = SimpleNamespace(utxo=seq.utxo, blobs=seq.blobs, state=seq.state,
                          settings=Settings(recovery_not_found_grace=60))
    young = handle(svc, entry(m, time.time()))  # type: ignore[arg-type]
    assert young.status == "pending" and seq.utxo.spenders([o1]) == {o1: m.txid}
    old = handle(svc, entry(m, time.time() - 120))  # type: ignore[arg-type]
    assert old.status == "orphan", old
    assert seq.utxo.spenders([o1]) == {o1: None} and not seq.utxo.existing([m.txid])


def test_a_check_whose_record_is_gone_is_no_error(seq: Sequencer) -> None:
    """`hold_inputs` of a tx whose record went meanwhile (a refused block's rollback deleting
    the record it made): nothing to hold, no error."""
    w = World(seq)
    m = spend((w.funds[1], 0))
    assert hold_inputs(seq.utxo, m, seq.utxo.current_height()) is None


def test_a_block_txs_mempool_copy_refused_between_its_create_and_spend_leaves_it_alone(
    seq: Sequencer,
) -> None:
    """A block's create phase made t's record, mined; before its spend phase (which makes the
    rival r conflicting), t's mempool copy is refused (r holds o1). Its record is the chain's:
    the copy leaves it alone, not conflicting (found by `test_mempool_races` on PostgreSQL:
    the check made a block's transaction conflicting)."""
    w = World(seq)
    o1 = (w.funds[1].txid, 0)
    r = spend((w.funds[1], 0), fee=3000)
    assert apply_tx(seq.utxo, r) is True
    t = spend((w.funds[1], 0))
    height = seq.utxo.current_height()
    (made,) = seq.utxo.create_many([t], height + 1, [BlockInfo(9, height + 1)])  # the block's create
    assert not isinstance(made, Exception)
    refused = apply_tx(seq.utxo, t)
    assert isinstance(refused, SpendRejected)
    assert not seq.utxo.get(t.txid).conflicting and seq.utxo.spenders([o1]) == {o1: r.txid}


def test_a_child_between_its_spend_and_its_record_follows_its_parent_into_conflict(
    seq: Sequencer,
) -> None:
    """p (mempool) spends o1; c spends p:0, then a block mining x (spending o1) comes before
    c's record. The block makes p conflicting, but c, with no record, is beyond its reach. c's
    record, made then, reads its parent's flag with its inputs: c is conflicting, p:0 is free
    (it used to stay a normal mempool tx spending a conflicting one's output)."""
    w = World(seq)
    o1 = (w.funds[1].txid, 0)
    p = spend((w.funds[1], 0), n_outputs=2)
    assert apply_tx(seq.utxo, p) is True
    c = spend((p, 0))
    height = seq.utxo.current_height()
    (spent,) = seq.utxo.spend_many([c], height + 1)  # the first half of `apply_tx`
    assert isinstance(spent, list)
    x = spend((w.funds[1], 0), fee=2000)
    w.add([x])
    assert seq.utxo.get(p.txid).conflicting and spender(w, o1) == x.txid
    assert spender(w, (p.txid, 0)) == c.txid  # (the block's marking could not find c)
    made = make_record(seq.utxo, c, height)  # the second half
    assert isinstance(made, TxConflicting) and f"spends conflicting tx {p.txid_hex}" in str(made)
    assert seq.utxo.get(c.txid).conflicting
    assert seq.utxo.spenders([(p.txid, 0), (p.txid, 1)]) == {(p.txid, 0): None, (p.txid, 1): None}
    assert make_record(seq.utxo, c, height) is False  # again: conflicting already, left alone
    w.check()


def test_the_recovery_manager_makes_an_escaped_child_conflicting(seq: Sequencer, tmp_path: Path) -> None:
    """c's record was made after a block made its parent p conflicting, and the check after it
    was lost with its worker: the recovery manager's look at c's entry makes it conflicting."""
    w = World(seq)
    p = spend((w.funds[1], 0))
    assert apply_tx(seq.utxo, p) is True
    c = spend((p, 0))
    height = seq.utxo.current_height()
    (spent,) = seq.utxo.spend_many([c], height + 1)
    assert isinstance(spent, list)
    w.add([spend((w.funds[1], 0), fee=2000)])
    (made,) = seq.utxo.create_many([c], height)  # the record, its check never run
    assert not isinstance(made, Exception) and not seq.utxo.get(c.txid).conflicting
    svc = SimpleNamespace(utxo=seq.utxo, blobs=seq.blobs, state=seq.state, settings=Settings())
    # (enqueued an hour ago: past the grace, the verdict is final)
    verdict = handle(svc, entry(c, time.time() - 3600))  # type: ignore[arg-type]
    assert verdict.status == "deleted" and f"spends conflicting tx {p.txid_hex}" in verdict.outcome, verdict
    assert seq.utxo.get(c.txid).conflicting and spender(w, (p.txid, 0)) is None
    w.check()


class _ChildFirst:
    """The store as a block's conflict walk sees it, but with c's own check (`hold_inputs`)
    run just before the walk looks c's record up: c finds its parent marked and marks itself
    first (a race open for the whole walk, and to each recovery scan)."""

    def __init__(self, utxo: Any, c: Tx) -> None:
        self.utxo, self.c, self.fired = utxo, c, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.utxo, name)

    def get(self, txid: bytes, *args: Any, **kwargs: Any) -> Any:
        if txid == self.c.txid and not self.fired:
            self.fired = True
            made = hold_inputs(self.utxo, self.c, self.utxo.current_height())
            assert isinstance(made, TxConflicting), made
        return self.utxo.get(txid, *args, **kwargs)


class _Walk(Conflicts):
    """A block's conflict handling with its undo record in memory."""

    def __init__(self, utxo: Any) -> None:
        self.utxo, self.chunk, self._undo, self._save = utxo, 1000, {}, None


def test_a_child_that_marked_itself_during_the_walk_is_the_blocks_to_give_back(seq: Sequencer) -> None:
    """A block's swap marks p conflicting; c, p's child, marks itself (its check saw p marked)
    before the walk reaches it. The walk still notes c in the block's undo record, so a refused
    block gives both back their spends (found by review: c stayed conflicting for good)."""
    w = World(seq)
    o1 = (w.funds[1].txid, 0)
    p = spend((w.funds[1], 0))
    c = spend((p, 0))
    assert apply_tx(seq.utxo, p) is True and apply_tx(seq.utxo, c) is True
    race = _ChildFirst(seq.utxo, c)
    walk = _Walk(race)
    walk.make_conflicting([p.txid])
    assert race.fired and seq.utxo.get(p.txid).conflicting and seq.utxo.get(c.txid).conflicting
    assert seq.utxo.spenders([o1, (p.txid, 0)]) == {o1: None, (p.txid, 0): None}
    assert walk._undo is not None and walk._undo["conflicted"] == [p.txid.hex(), c.txid.hex()]
    walk.restore([bytes.fromhex(h) for h in walk._undo["conflicted"]], seq.utxo.current_height())
    walk.unlock_swapped()
    assert not seq.utxo.get(p.txid).conflicting and not seq.utxo.get(c.txid).conflicting
    assert seq.utxo.spenders([o1, (p.txid, 0)]) == {o1: p.txid, (p.txid, 0): c.txid}
    assert not seq.utxo.get(w.funds[1].txid).locked
    w.check()


def test_a_child_with_no_record_during_the_walk_is_the_blocks_to_give_back(seq: Sequencer) -> None:
    """c has spent p's output but has no record when a block's swap walks p's tree: the walk
    finds c as the spender and nothing to mark. c's record comes after, and c marks itself
    conflicting (its check sees p marked). The walk noted c all the same, so a refused block
    gives both back (issue 36: c stayed conflicting for good, in no block's undo record)."""
    w = World(seq)
    o1 = (w.funds[1].txid, 0)
    p = spend((w.funds[1], 0))
    c = spend((p, 0))
    assert apply_tx(seq.utxo, p) is True
    height = seq.utxo.current_height()
    (spent,) = seq.utxo.spend_many([c], height + 1)  # c's spend, not its record (yet)
    assert isinstance(spent, list)
    walk = _Walk(seq.utxo)
    walk.make_conflicting([p.txid])
    assert walk._undo is not None and walk._undo["conflicted"] == [p.txid.hex(), c.txid.hex()]
    made = make_record(seq.utxo, c, height)  # c's record: its check finds p marked
    assert isinstance(made, TxConflicting) and seq.utxo.get(c.txid).conflicting, made
    walk.restore([bytes.fromhex(h) for h in walk._undo["conflicted"]], seq.utxo.current_height())
    walk.unlock_swapped()
    assert not seq.utxo.get(p.txid).conflicting and not seq.utxo.get(c.txid).conflicting
    assert seq.utxo.spenders([o1, (p.txid, 0)]) == {o1: p.txid, (p.txid, 0): c.txid}
    w.check()
