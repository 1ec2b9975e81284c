"""The coordination of a block phase's units (workers/chainstate/fanout.py) over a real state store: a
block about to be taken back has its postings cancelled and its live claims waited out; a
helper that cannot load the block gives its unit back; a coordinator whose posting another
took over stops; a multi-record tx whose creator holds only its lock makes the block wait."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stores.state import StateStore, open_state_store
from stores.state.chunks import TODO
from stores.utxo import StorageError
from tests.pipeline.chains import spend
from tests.pipeline.world import World
from workers.chainstate.fanout import TaskFanout, help_with, settle_block, work_units
from workers.chainstate.sequencer import LEASE, Sequencer

B = hashlib.sha256(b"a block").digest()


@pytest.fixture
def state(tmp_path: Path) -> Any:
    s = open_state_store(f"sqlite:///{tmp_path}/state.db")
    yield s
    s.close()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_settle_waits_out_a_live_claim_and_skips_a_dead_local_holder(state: StateStore) -> None:
    state.post_units(B, "spend", "r", [{"i": i} for i in range(4)])
    assert state.claim_unit(B, "spend", "r", f"{socket.gethostname()}:{dead_pid()}:x", 600)
    assert state.claim_unit(B, "spend", "r", "another-host:1:x", 0.5)  # alive, as far as we know
    t0 = time.monotonic()
    settle_block(state, B, wait_s=30)
    waited = time.monotonic() - t0
    assert 0.3 < waited < 10  # the remote claim until it lapsed; the dead local one not at all
    assert state.unit_states(B, "spend", "r") == []  # the postings are gone
    assert state.claim_unit(B, "spend", "r", "late", 60) is None


def test_settle_gives_up_waiting_after_its_bound(state: StateStore) -> None:
    state.post_units(B, "create", "r", [{"i": 0}, {"i": 1}])
    assert state.claim_unit(B, "create", "r", "another-host:1:x", 600)
    t0 = time.monotonic()
    settle_block(state, B, wait_s=0.3)
    assert time.monotonic() - t0 < 5 and state.unit_states(B, "create", "r") == []


class _Never:
    def execute(self, *_: Any) -> dict[str, Any]:
        raise AssertionError("a unit ran without its block")


def test_a_helper_that_cannot_load_the_block_gives_its_unit_back(state: StateStore) -> None:
    state.post_units(B, "spend", "r", [{"i": 0}])

    def missing() -> Any:
        raise StorageError("the block's bytes are not here")

    assert work_units(state, _Never(), B, missing, "spend", "r", {}, "helper", 60) == 0  # type: ignore[arg-type]
    (u,) = state.unit_states(B, "spend", "r")
    assert u.state == TODO and u.holder is None  # for the coordinator, which has the block


def test_a_coordinator_whose_posting_was_taken_over_stops(seq: Sequencer) -> None:
    w = World(seq, n_funds=20)
    raw = w.chain.next_block([spend((w.funds[i], 0)) for i in range(1, 20)])
    block = seq.store_block(raw)

    def rival(_task: str, _args: list[Any]) -> None:  # another coordinator reposts the phase
        seq.state.post_units(block.hash, "mine", "rival", [{"start": 0, "end": 1}])

    fan = TaskFanout(seq.state, rival, max_helpers=1)
    with pytest.raises(StorageError, match="took the block over"):
        fan.run(seq.applier, block, "mine", {"height": 1002, "block_id": 99},
                [{"start": 0, "end": 10}, {"start": 10, "end": 20}])
    assert len(seq.state.unit_states(block.hash, "mine", "rival")) == 1  # the rival's posting stays


def test_a_multi_record_tx_whose_creator_holds_only_its_lock_makes_the_block_wait(seq: Sequencer) -> None:
    w = World(seq)
    big = spend((w.funds[1], 0), n_outputs=seq.utxo.batch_size + 1)
    lock = seq.utxo.acquire_creation_lock(big.txid, 2, {})  # another creator, nothing written yet
    assert lock is not None
    e = seq.accept(seq.store_block(w.chain.next_block([big])))
    assert e is not None
    with pytest.raises(StorageError, match="being created by another worker"):
        seq.advance()
    seq.utxo.release_creation_lock(lock)
    tip = seq.advance()  # the lock gone, the block applies (the half-applied one taken back first)
    assert tip is not None and tip.hash == e.hash
    assert seq.utxo.get(big.txid).total_utxos == len(big.outputs)


def test_a_coordinator_that_lost_the_chain_lease_stops(seq: Sequencer) -> None:
    """A phase longer than the chain lease: the coordinator renews it as it goes, and stops
    when another worker has taken it meanwhile (here, taken while the helpers are called)."""
    w = World(seq, n_funds=30)
    quick = Sequencer(seq.utxo, seq.state, seq.blobs, lease_s=0.4, chunk_txs=5)

    def thief(_task: str, _args: list[Any]) -> None:
        seq.state.release_lease(LEASE, quick.holder)
        assert seq.state.acquire_lease(LEASE, "another-host:1:thief", 60)
        time.sleep(0.15)  # past a quarter of the lease: the next heartbeat renews

    quick.applier.fanout = TaskFanout(seq.state, thief, max_helpers=1)
    e = quick.accept(quick.store_block(w.chain.next_block([spend((w.funds[i], 0)) for i in range(1, 30)])))
    assert e is not None
    with pytest.raises(StorageError, match="chain lease was lost"):
        quick.advance()
    assert seq.state.lease_holder(LEASE) == "another-host:1:thief"


def test_a_helper_does_not_trust_a_corrupted_stored_copy(seq: Sequencer) -> None:
    """The coordinator may hold the genuine block while the blob store has a corrupted copy (the
    same hash, other transactions): a helper must not run units against it."""
    w = World(seq)
    good = w.chain.next_block([spend((w.funds[1], 0)), spend((w.funds[2], 0))])
    bad = seq.store_block(good[:-1] + bytes([good[-1] ^ 1]))  # the last tx's locktime changed
    with pytest.raises(StorageError, match="does not match its header"):
        seq.genuine(bad.hash)
    seq.state.post_units(bad.hash, "spend", "r", [{"start": 0, "end": 3}])
    assert help_with(seq.state, seq.applier, seq.genuine, bad.hash_hex, "spend", "r",
                     {"height": 1002, "block_id": 5}) == 0
    (u,) = seq.state.unit_states(bad.hash, "spend", "r")
    assert u.state == TODO  # given back, for the coordinator


class _Counting:
    """An applier that only counts the units it runs (every unit succeeds)."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def heartbeat(self) -> None:
        pass

    def execute(self, _block: Any, _phase: str, _ctx: dict[str, int], spec: dict[str, Any]) -> dict[str, Any]:
        self.ran.append(spec)
        return {}


def test_a_phase_of_few_units_is_not_shared(seq: Sequencer) -> None:
    """Below `share_from` units the coordinator runs them all (no posting, no helper task);
    from there on it posts them and calls helpers."""
    w = World(seq)
    block = seq.store_block(w.chain.next_block([spend((w.funds[1], 0))]))
    sent: list[str] = []
    fan = TaskFanout(seq.state, lambda task, _args: sent.append(task), max_helpers=2, share_from=4)
    ctx = {"height": 1002, "block_id": 99}
    applier = _Counting()
    three = [{"i": i} for i in range(3)]
    assert fan.run(applier, block, "spend", ctx, three) == [{}, {}, {}]  # type: ignore[arg-type]
    assert sent == [] and applier.ran == three
    four = [{"i": i} for i in range(3, 7)]
    assert fan.run(applier, block, "spend", ctx, four) == [{}, {}, {}, {}]  # type: ignore[arg-type]
    assert sent == ["utxoflow.chunk.spend"] * 2  # (no helper came: the coordinator ran them)
    assert sorted(u["i"] for u in applier.ran[3:]) == [3, 4, 5, 6]
