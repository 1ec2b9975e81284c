"""The state store's contract (stores/state/protocol.py), checked on every backend: the block
index (create-only adds, arrival order, updates, children, the best candidate), the tip, undo
records, leases (also raced by real processes) and how a store is opened."""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from stores.errors import StorageError
from stores.state import BlockEntry, BlockStatus, StateStore, open_state_store
from stores.state.sql import SCHEMA
from stores.utxo.sqlite import sqlite_path
from tests.processes import race
from tests.state.conftest import raw_sql

P, A, S = BlockStatus.PENDING, BlockStatus.APPLIED, BlockStatus.SIDE
ORPH, INV = BlockStatus.ORPHAN, BlockStatus.INVALID
CANDIDATES = (P, A, S)


def h(n: int | str) -> bytes:
    """A block hash (32 bytes, internal order) named by `n`."""
    return hashlib.sha256(f"block {n}".encode()).digest()


GENESIS_PARENT = bytes(32)


def add(
    state: StateStore, n: int | str, parent: bytes = GENESIS_PARENT, height: int | None = 1,
    work: int | None = 1, status: BlockStatus = P, n_txs: int = 1, reason: str | None = None,
) -> BlockEntry:
    return state.add_block(h(n), parent, height, work, status, n_txs, reason)


# -- add_block / get_block ---------------------------------------------------------------------


def test_fresh_store_is_empty_and_knows_nothing(state: StateStore) -> None:
    assert isinstance(state, StateStore)
    assert state.is_empty() is True
    assert state.counts() == {}
    assert state.tip() is None
    assert state.best_candidate() is None
    assert state.get_block(h(0)) is None
    assert state.children(GENESIS_PARENT) == []
    assert state.get_undo(h(0)) is None


def test_add_block_returns_the_stored_entry(state: StateStore) -> None:
    e = state.add_block(h(1), h(0), 7, 2**70 + 3, A, 42, None)
    assert (e.hash, e.parent, e.height, e.work, e.status, e.reason, e.n_txs) == (
        h(1), h(0), 7, 2**70 + 3, A, None, 42,
    )
    assert isinstance(e.status, BlockStatus) and isinstance(e.seq, int) and isinstance(e.block_id, int)
    assert state.get_block(h(1)) == e
    assert state.is_empty() is False


def test_add_block_keeps_hash_bytes_exactly(state: StateStore) -> None:
    # leading and trailing zero bytes, and bytes that are not valid UTF-8, survive the round trip
    odd = [bytes(31) + b"\x01", b"\x01" + bytes(31), b"\xff" * 32, bytes(range(200, 232))]
    for i, hh in enumerate(odd):
        e = state.add_block(hh, odd[i - 1], i, i + 1, P, 1)
        assert e.hash == hh and e.parent == odd[i - 1]
    for i, hh in enumerate(odd):
        got = state.get_block(hh)
        assert got is not None and got.hash == hh and got.parent == odd[i - 1] and got.height == i
    assert state.get_block(bytes(32)) is None


def test_add_block_is_create_only(state: StateStore) -> None:
    first = add(state, 1, parent=h(0), height=5, work=100, status=P, n_txs=3)
    again = state.add_block(h(1), h(99), 6, 999, INV, 77, "other values")
    assert again == first
    assert state.get_block(h(1)) == first
    assert state.counts() == {"pending": 1}
    assert state.children(h(99)) == []
    assert [c.hash for c in state.children(h(0))] == [h(1)]
    # a later block still comes after it
    later = add(state, 2)
    assert later.seq > first.seq and later.block_id != first.block_id


def test_add_block_is_create_only_after_updates(state: StateStore) -> None:
    add(state, 1, height=None, work=None, status=ORPH)
    state.update_block(h(1), status=P, height=3, work=30)
    updated = state.get_block(h(1))
    assert updated is not None
    assert add(state, 1, height=None, work=None, status=ORPH) == updated  # the stored one, updates included


def test_seq_follows_arrival_order_and_block_ids_are_unique(state: StateStore) -> None:
    names = list(range(40))
    random.Random(7).shuffle(names)  # hashes in no particular order
    entries = [add(state, n, height=i, work=i + 1) for i, n in enumerate(names)]
    seqs = [e.seq for e in entries]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len({e.block_id for e in entries}) == len(entries)
    for e in entries:
        assert state.get_block(e.hash) == e  # arrival order never changes


def test_seq_and_block_id_continue_after_reopen(state_url: str) -> None:
    s = open_state_store(state_url)
    before = [add(s, n) for n in range(5)]
    s.close()
    s = open_state_store(state_url)
    try:
        assert [s.get_block(e.hash) for e in before] == before
        after = add(s, 5)
        assert after.seq > max(e.seq for e in before)
        assert after.block_id not in {e.block_id for e in before}
    finally:
        s.close()


def test_orphans_have_no_height_or_work(state: StateStore) -> None:
    o = add(state, "orphan", parent=h("missing"), height=None, work=None, status=ORPH)
    assert o.height is None and o.work is None and o.status is ORPH
    got = state.get_block(h("orphan"))
    assert got is not None and got.height is None and got.work is None
    assert [c.hash for c in state.children(h("missing"))] == [h("orphan")]


def test_reason_is_kept(state: StateStore) -> None:
    e = add(state, 1, status=INV, reason="bad-merkle-root")
    assert e.reason == "bad-merkle-root"
    got = state.get_block(h(1))
    assert got is not None and got.reason == "bad-merkle-root" and got.status is INV
    assert got.to_json()["reason"] == "bad-merkle-root"
    assert "reason" not in add(state, 2).to_json()


# -- update_block ------------------------------------------------------------------------------


def test_update_block_changes_only_the_given_fields(state: StateStore) -> None:
    orig = add(state, 1, parent=h(0), height=None, work=None, status=ORPH, n_txs=9)
    other = add(state, 2, parent=h(1), height=4, work=40, status=P, n_txs=2)

    state.update_block(h(1), status=P)
    e = state.get_block(h(1))
    assert e is not None
    assert (e.status, e.height, e.work, e.reason) == (P, None, None, None)
    assert (e.hash, e.parent, e.seq, e.block_id) == (orig.hash, orig.parent, orig.seq, orig.block_id)
    assert e.n_txs == 9

    state.update_block(h(1), height=3, work=2**200 + 5)
    e = state.get_block(h(1))
    assert e is not None and (e.status, e.height, e.work, e.reason) == (P, 3, 2**200 + 5, None)

    state.update_block(h(1), reason="why")
    e = state.get_block(h(1))
    assert e is not None and (e.status, e.height, e.work, e.reason) == (P, 3, 2**200 + 5, "why")

    state.update_block(h(1), status=INV)
    e = state.get_block(h(1))
    assert e is not None and (e.status, e.height, e.work, e.reason) == (INV, 3, 2**200 + 5, "why")
    assert (e.hash, e.parent, e.seq, e.block_id) == (orig.hash, orig.parent, orig.seq, orig.block_id)
    assert e.n_txs == 9

    assert state.get_block(h(2)) == other  # the other block is untouched


def test_update_block_accepts_zero(state: StateStore) -> None:
    add(state, "g", height=None, work=None, status=ORPH)
    state.update_block(h("g"), height=0, work=0, status=P)
    e = state.get_block(h("g"))
    assert e is not None and (e.height, e.work, e.status) == (0, 0, P)


def test_update_block_of_unknown_hash_raises(state: StateStore) -> None:
    add(state, 1)
    with pytest.raises(StorageError):
        state.update_block(h(2), status=A)
    with pytest.raises(StorageError):
        state.update_block(h(2), height=1, work=1)
    assert state.get_block(h(2)) is None
    assert state.counts() == {"pending": 1}


# -- children ----------------------------------------------------------------------------------


def test_children_in_arrival_order(state: StateStore) -> None:
    add(state, "p")
    names = ["z", "a", "m", "b", "y"]
    statuses = [P, S, INV, ORPH, A]
    for n, st in zip(names, statuses):
        orphan = st is ORPH
        add(state, n, parent=h("p"), status=st, work=None if orphan else 5, height=None if orphan else 2)
    add(state, "grandchild", parent=h("a"))
    add(state, "unrelated", parent=h("q"))
    kids = state.children(h("p"))
    assert [k.hash for k in kids] == [h(n) for n in names]  # every status, arrival order
    assert [k.status for k in kids] == statuses
    assert [k.seq for k in kids] == sorted(k.seq for k in kids)
    assert all(k == state.get_block(k.hash) for k in kids)
    assert [k.hash for k in state.children(h("a"))] == [h("grandchild")]
    assert state.children(h("grandchild")) == []


# -- best_candidate ----------------------------------------------------------------------------


@pytest.mark.parametrize("winner", CANDIDATES, ids=lambda s: s.value)
def test_best_candidate_is_most_work_among_candidates(state: StateStore, winner: BlockStatus) -> None:
    for i, st in enumerate(CANDIDATES):
        if st is not winner:
            add(state, f"{st}", work=100 + i, status=st)
    add(state, "win", work=1000, status=winner)
    add(state, "after", work=999, status=P)
    best = state.best_candidate()
    assert best is not None and best.hash == h("win") and best.status is winner


def test_best_candidate_never_invalid_or_orphan(state: StateStore) -> None:
    add(state, "bad", work=10**30, status=INV, reason="bad")
    add(state, "orphan", height=None, work=None, status=ORPH)
    assert state.best_candidate() is None  # nothing eligible
    add(state, "ok", work=5, status=S)
    best = state.best_candidate()
    assert best is not None and best.hash == h("ok")
    # an invalid entry with known work (e.g. refused after connecting) still never wins
    add(state, "heavy", work=10**31, status=P)
    assert state.best_candidate().hash == h("heavy")  # type: ignore[union-attr]
    state.update_block(h("heavy"), status=INV, reason="script")
    assert state.best_candidate().hash == h("ok")  # type: ignore[union-attr]
    # an orphan that is given work but stays an orphan never wins either
    state.update_block(h("orphan"), work=10**32, height=9)
    assert state.best_candidate().hash == h("ok")  # type: ignore[union-attr]
    state.update_block(h("orphan"), status=P)
    assert state.best_candidate().hash == h("orphan")  # type: ignore[union-attr]


def test_best_candidate_ties_go_to_the_first_seen(state: StateStore) -> None:
    # the later blocks' hashes sort before the first one's, so only arrival order can pick it
    names = sorted(range(30), key=lambda n: h(n), reverse=True)
    for n in names:
        add(state, n, work=2**200 + 7, status=S)
    add(state, "lighter", work=2**200 + 6, status=P)
    best = state.best_candidate()
    assert best is not None and best.hash == h(names[0])
    state.update_block(h(names[0]), status=INV)
    best = state.best_candidate()
    assert best is not None and best.hash == h(names[1])
    state.update_block(h(names[1]), status=A)  # still a candidate, still the first seen
    best = state.best_candidate()
    assert best is not None and best.hash == h(names[1])


def test_best_candidate_changes_when_work_is_updated(state: StateStore) -> None:
    add(state, 1, work=10)
    add(state, 2, work=9, status=S)
    assert state.best_candidate().hash == h(1)  # type: ignore[union-attr]
    state.update_block(h(2), work=11)
    assert state.best_candidate().hash == h(2)  # type: ignore[union-attr]


def test_best_candidate_compares_work_as_numbers(state: StateStore) -> None:
    add(state, "ff", work=0xFF)
    add(state, "100", work=0x100)
    assert state.best_candidate().hash == h("100")  # type: ignore[union-attr]
    add(state, "9", work=9)
    add(state, "10", work=10)
    assert state.best_candidate().hash == h("100")  # type: ignore[union-attr]
    add(state, "2^64-1", work=2**64 - 1)
    add(state, "2^64", work=2**64)
    assert state.best_candidate().hash == h("2^64")  # type: ignore[union-attr]


def test_best_candidate_with_work_beyond_64_bits(state: StateStore) -> None:
    ks = list(range(25))
    random.Random(3).shuffle(ks)
    for k in ks:
        add(state, k, work=2**200 + k, status=CANDIDATES[k % 3])
    add(state, "2^199", work=2**199 * 3 // 2)
    add(state, "2^64", work=2**64 + 2**63)
    for k in ks:
        e = state.get_block(h(k))
        assert e is not None and e.work == 2**200 + k  # exact round trip
    best = state.best_candidate()
    assert best is not None and best.hash == h(24) and best.work == 2**200 + 24
    add(state, "top", work=2**256 - 1)
    best = state.best_candidate()
    assert best is not None and best.hash == h("top") and best.work == 2**256 - 1


# -- tip, is_empty, counts ---------------------------------------------------------------------


def test_tip_set_replace_and_clear(state: StateStore) -> None:
    a = add(state, "a", status=A)
    b = add(state, "b", parent=h("a"), height=2, work=2, status=A)
    assert state.tip() is None
    state.set_tip(h("a"))
    assert state.tip() == a
    state.set_tip(h("b"))
    assert state.tip() == b
    state.update_block(h("b"), reason="noted")
    tip = state.tip()
    assert tip is not None and tip.reason == "noted"  # the tip is read from the block index
    state.set_tip(None)
    assert state.tip() is None
    assert state.get_block(h("a")) == a and state.is_empty() is False  # clearing keeps the blocks


def test_commit_changes_blocks_tip_undo_and_meta_together(state: StateStore) -> None:
    """One transaction: the block applied, the tip on it, its undo marked, the applying mark
    gone, and the undo records of applied blocks below a height deleted."""
    from stores.state import BlockChange

    add(state, "a", status=A)
    add(state, "b", parent=h("a"), height=2, work=2, status=P)
    state.put_undo(h("a"), {"state": "applied"})
    state.put_undo(h("b"), {"state": "applying"})
    state.set_meta("applying", h("b").hex())
    state.commit(blocks=[BlockChange(h("b"), status=A)], tip=h("b"), undo={h("b"): {"state": "applied"}},
                 meta={"applying": None}, prune_undo_below=1)
    assert state.tip() == state.get_block(h("b")) and state.get_block(h("b")).status is A  # type: ignore[union-attr]
    assert state.get_undo(h("b")) == {"state": "applied"} and state.get_undo(h("a")) is None
    assert state.get_meta("applying") is None


def test_commit_is_all_or_nothing(state: StateStore) -> None:
    """A change that cannot be made (an unknown block) leaves everything else of it undone."""
    from stores.state import BlockChange

    add(state, "a", status=P)
    with pytest.raises(StorageError):
        state.commit(blocks=[BlockChange(h("a"), status=A), BlockChange(h("nope"), status=A)], tip=h("a"),
                     meta={"applying": "x"})
    assert state.get_block(h("a")).status is P and state.tip() is None  # type: ignore[union-attr]
    assert state.get_meta("applying") is None


def test_prepared_deltas_are_written_replaced_and_deleted_by_commit(state: StateStore) -> None:
    """A prepared delta round-trips whole (negative changes, 384 bytes), a second write replaces
    it, None deletes it, and it goes, whatever its block's status, when undo records are pruned
    below its block's height — all within `commit`'s one transaction."""
    from stores.state import BlockChange, PreparedDelta

    d1 = PreparedDelta("aa" * 32 + ":7", bytes(range(256)) + bytes(128), -3, -(2**40))
    d2 = PreparedDelta("bb" * 32 + ":8", b"\x01" * 384, 5, 10**15)
    assert state.get_delta(h("a")) is None
    state.commit(deltas={h("a"): d1, h("b"): d2})
    assert state.get_delta(h("a")) == d1 and state.get_delta(h("b")) == d2
    state.commit(deltas={h("a"): d2})
    assert state.get_delta(h("a")) == d2
    state.commit(deltas={h("a"): None, h("nope"): None})  # deleting what is not there is harmless
    assert state.get_delta(h("a")) is None and state.get_delta(h("b")) == d2
    add(state, "b", status=P, height=1)
    state.commit(deltas={h("c"): d1})
    with pytest.raises(StorageError):  # all or nothing: the delta goes back with the bad change
        state.commit(blocks=[BlockChange(h("nope"), status=A)], deltas={h("b"): None})
    assert state.get_delta(h("b")) == d2
    add(state, "s", status=S, height=1)  # a side branch's block down there: its delta goes too
    add(state, "t", status=P, height=2)  # above: stays
    state.commit(deltas={h("s"): d1, h("t"): d1})
    state.commit(blocks=[BlockChange(h("b"), status=A)], prune_undo_below=1)
    assert state.get_delta(h("b")) is None and state.get_delta(h("s")) is None
    assert state.get_delta(h("c")) == d1 and state.get_delta(h("t")) == d1  # (c is in no block)


def test_demote_pending(state: StateStore) -> None:
    add(state, "a", work=5, status=P)
    add(state, "b", work=7, status=P)
    assert state.demote_pending(5) == 1
    assert state.get_block(h("a")).status is S and state.get_block(h("b")).status is P  # type: ignore[union-attr]


def test_tip_survives_reopen(state_url: str) -> None:
    s = open_state_store(state_url)
    e = add(s, "t", status=A)
    s.set_tip(h("t"))
    s.close()
    s = open_state_store(state_url)
    try:
        assert s.tip() == e
    finally:
        s.close()


def test_is_empty_follows_blocks(state: StateStore) -> None:
    assert state.is_empty()
    add(state, "o", height=None, work=None, status=ORPH)
    assert not state.is_empty()


def test_counts_by_status(state: StateStore) -> None:
    plan = {P: 3, A: 4, S: 2, ORPH: 1, INV: 5}
    i = 0
    for st, n in plan.items():
        for _ in range(n):
            orphan = st is ORPH
            add(state, i, status=st, height=None if orphan else i, work=None if orphan else i + 1)
            i += 1
    assert state.counts() == {st.value: n for st, n in plan.items()}
    state.update_block(h(0), status=A)  # a pending block applied
    state.update_block(h(9), status=P, height=9, work=10)  # the orphan connected
    assert state.counts() == {"pending": 3, "applied": 5, "side": 2, "invalid": 5}
    assert "orphan" not in state.counts()


# -- undo records ------------------------------------------------------------------------------

UNDO = {
    "spent": [["ab" * 32, 0, 5000000000, "76a914" + "00" * 20 + "88ac"], ["cd" * 32, 7, 1, ""]],
    "created": ["ef" * 32, "01" * 32],
    "nested": {"deep": [[1, [2, [3, None]]], {"k": True, "f": False}], "empty": [], "obj": {}},
    "big": 2**62 + 1,
    "text": "ünïcode ✓",
}


def test_undo_round_trips_whole(state: StateStore) -> None:
    add(state, 1)
    state.put_undo(h(1), UNDO)
    got = state.get_undo(h(1))
    assert got == UNDO
    assert json.dumps(got, sort_keys=True) == json.dumps(UNDO, sort_keys=True)
    assert state.get_undo(h(2)) is None


def test_undo_put_again_replaces(state: StateStore) -> None:
    state.put_undo(h(1), {"old": [1, 2, 3], "shared": "first"})
    state.put_undo(h(1), {"shared": "second", "new": ["aa" * 32]})
    assert state.get_undo(h(1)) == {"shared": "second", "new": ["aa" * 32]}  # replaced, not merged


def test_undo_delete(state: StateStore) -> None:
    state.put_undo(h(1), {"a": 1})
    state.put_undo(h(2), {"b": [2]})
    state.delete_undo(h(1))
    assert state.get_undo(h(1)) is None
    assert state.get_undo(h(2)) == {"b": [2]}
    state.delete_undo(h(1))  # deleting what is not there is harmless
    state.delete_undo(h(3))
    assert state.get_undo(h(2)) == {"b": [2]}
    state.put_undo(h(1), {"again": True})
    assert state.get_undo(h(1)) == {"again": True}


def test_large_undo_record(state: StateStore) -> None:
    data = {"spent": [[hashlib.sha256(str(i).encode()).hexdigest(), i, i * 1000, "51"] for i in range(20000)]}
    state.put_undo(h("big"), data)
    assert state.get_undo(h("big")) == data


# -- leases ------------------------------------------------------------------------------------


def test_lease_has_one_holder(state: StateStore) -> None:
    assert state.acquire_lease("seq", "a", 30) is True
    assert state.acquire_lease("seq", "b", 30) is False
    assert state.acquire_lease("seq", "a", 30) is True  # the holder renews
    assert state.acquire_lease("seq", "b", 30) is False
    assert state.acquire_lease("other", "b", 30) is True  # leases are independent by name
    assert state.acquire_lease("other", "a", 30) is False


def test_renewal_extends_the_lease(state: StateStore) -> None:
    assert state.acquire_lease("seq", "a", 0.3)
    time.sleep(0.1)
    assert state.acquire_lease("seq", "a", 0.6)  # now held until ≈0.7 s
    time.sleep(0.35)  # past the first expiry
    assert state.acquire_lease("seq", "b", 0.3) is False
    time.sleep(0.4)  # past the renewed expiry
    assert state.acquire_lease("seq", "b", 30) is True


def test_another_holder_takes_an_expired_lease(state: StateStore) -> None:
    assert state.acquire_lease("seq", "a", 0.3)
    assert state.acquire_lease("seq", "b", 0.3) is False
    time.sleep(0.4)
    assert state.acquire_lease("seq", "b", 30) is True
    assert state.acquire_lease("seq", "a", 30) is False  # the old holder lost it


def test_release(state: StateStore) -> None:
    assert state.acquire_lease("seq", "a", 30)
    state.release_lease("seq", "b")  # not the holder: nothing happens
    assert state.acquire_lease("seq", "b", 30) is False
    state.release_lease("other", "a")  # another lease: nothing happens
    assert state.acquire_lease("seq", "b", 30) is False
    state.release_lease("seq", "a")
    assert state.acquire_lease("seq", "b", 30) is True  # at once, without waiting for expiry
    state.release_lease("nothing", "x")  # releasing an unknown lease is harmless


def test_leases_are_shared_between_handles(state: StateStore, state_url: str) -> None:
    other = open_state_store(state_url)
    try:
        assert state.acquire_lease("seq", "a", 30)
        assert other.acquire_lease("seq", "b", 30) is False
        other.release_lease("seq", "a")  # any handle may release for the holder it names
        assert other.acquire_lease("seq", "b", 30) is True
        assert state.acquire_lease("seq", "a", 30) is False
    finally:
        other.close()


LEASE_ROUNDS = 15


def _lease_racer(url: str, holder: str, names: list[str], barrier: Any, out: Any) -> None:
    results: list[Any] = []
    try:
        store = open_state_store(url, create=False)
        for name in names:
            barrier.wait(timeout=60)
            results.append(store.acquire_lease(name, holder, 60))
        store.close()
    except Exception as e:  # reported to the parent at once, not as a queue time-out
        results.append(repr(e))
        barrier.abort()  # and the others stop waiting for this one
    finally:
        out.put((holder, results))


def test_processes_racing_for_one_lease(state: StateStore, state_url: str) -> None:
    fresh = [f"fresh-{i}" for i in range(LEASE_ROUNDS)]
    expired = [f"expired-{i}" for i in range(LEASE_ROUNDS)]
    for name in expired:  # held by someone who has gone away: the racers must delete, then take it
        assert state.acquire_lease(name, "gone", 0.001)
    time.sleep(0.05)
    names = [n for pair in zip(fresh, expired) for n in pair]
    holders = ["p0", "p1", "p2"]
    results = dict(race(_lease_racer, [(state_url, hd, names) for hd in holders]))
    for hd in holders:
        assert len(results[hd]) == len(names) and all(isinstance(r, bool) for r in results[hd]), results[hd]
    for i, name in enumerate(names):
        winners = [hd for hd in holders if results[hd][i]]
        assert len(winners) == 1, (name, winners)
        assert state.acquire_lease(name, "parent", 60) is False  # still held ...
        assert state.acquire_lease(name, winners[0], 60) is True  # ... by the winner


def _add_racer(url: str, who: int, barrier: Any, out: Any) -> None:
    results: list[Any] = []
    try:
        store = open_state_store(url, create=False)
        for i in range(10):
            barrier.wait(timeout=60)
            shared = store.add_block(h(f"shared-{i}"), h("base"), 1, 1, P, who)
            own = store.add_block(h(f"own-{i}-{who}"), h("base"), 1, 1, P, who)
            results.append((shared.n_txs, shared.seq, own.seq, own.block_id))
        store.close()
    except Exception as e:
        results.append(repr(e))
        barrier.abort()
    finally:
        out.put((who, results))


def test_processes_adding_blocks_at_once(state: StateStore, state_url: str) -> None:
    """Create-only holds across processes: one entry per hash, the same one returned to all;
    arrival order and block ids stay unique."""
    racers = [0, 1, 2]
    results = dict(race(_add_racer, [(state_url, w) for w in racers]))
    for w in racers:
        assert len(results[w]) == 10 and all(isinstance(r, tuple) for r in results[w]), results[w]
    for i in range(10):
        shared = state.get_block(h(f"shared-{i}"))
        assert shared is not None
        assert {results[w][i][:2] for w in racers} == {(shared.n_txs, shared.seq)}  # all saw the first add
    entries = [state.get_block(h(f"own-{i}-{w}")) for i in range(10) for w in racers]
    assert all(e is not None for e in entries)
    everything = state.children(h("base"))
    assert len(everything) == 10 + 10 * len(racers) and state.counts() == {"pending": len(everything)}
    assert len({e.seq for e in everything}) == len(everything)
    assert len({e.block_id for e in everything}) == len(everything)


# -- opening a store ---------------------------------------------------------------------------


def test_create_false_on_a_missing_sqlite_file(tmp_path: Path) -> None:
    for url, where in ((f"sqlite:///{tmp_path}/state.db", tmp_path / "state.db"),
                       (f"sqlite:///{tmp_path}/sub/dir/state.db", tmp_path / "sub")):
        with pytest.raises(StorageError):
            open_state_store(url, create=False)
        assert not where.exists()
    assert list(tmp_path.iterdir()) == []  # nothing created: no file, no directory, no WAL


def test_create_false_opens_an_existing_sqlite_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/deep/state.db"
    s = open_state_store(url)  # create=True makes the directories
    e = add(s, 1)
    s.close()
    s = open_state_store(url, create=False)
    try:
        assert s.get_block(h(1)) == e
    finally:
        s.close()


@pytest.mark.parametrize("url", ["mysql://root@localhost/db", "redis://127.0.0.1:6379/0", "file:///tmp/x"])
def test_unknown_url_scheme(url: str) -> None:
    with pytest.raises(ValueError, match=url.split("://")[0]):
        open_state_store(url)


def test_other_schema_version_is_refused(state_url: str) -> None:
    open_state_store(state_url).close()
    raw_sql(state_url, "UPDATE chain SET value = ? WHERE key = 'schema'", ("utxoflow-state-0",))
    with pytest.raises(StorageError) as err:
        open_state_store(state_url)
    assert "utxoflow-state-0" in str(err.value) and SCHEMA in str(err.value)
    assert raw_sql(state_url, "SELECT value FROM chain WHERE key = 'schema'") == [("utxoflow-state-0",)]


def _tables(url: str) -> set[str]:
    if url.startswith("sqlite:"):
        return {r[0] for r in raw_sql(url, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    rows = raw_sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {r[0] for r in rows}


def test_create_false_refuses_a_database_holding_no_state_store(state_url: str) -> None:
    # a database that exists but holds something else (here one foreign table), as a mistyped URL would
    raw_sql(state_url, "CREATE TABLE unrelated (x INTEGER)")
    with pytest.raises(StorageError, match="no state store"):
        open_state_store(state_url, create=False)
    assert not _tables(state_url) & {"blocks", "chain", "undo", "leases", "pending"}  # nothing was added
    open_state_store(state_url).close()  # create=True makes one ...
    s = open_state_store(state_url, create=False)  # ... which create=False then opens
    try:
        assert s.is_empty()
    finally:
        s.close()
        raw_sql(state_url, "DROP TABLE unrelated")


def _connections(url: str) -> int:
    if url.startswith("sqlite:"):  # this process's open files on the database
        fds = Path("/proc/self/fd")
        if not fds.is_dir():
            pytest.skip("counting open SQLite files needs /proc")
        db = str(Path(sqlite_path(url)).resolve())
        n = 0
        for fd in fds.iterdir():
            try:
                n += Path(fd.readlink()).as_posix() == db
            except OSError:
                pass
        return n
    others = "datname = current_database() AND pid <> pg_backend_pid()"
    rows = raw_sql(url, f"SELECT count(*) FROM pg_stat_activity WHERE {others}")
    return int(rows[0][0])


def test_a_refused_store_leaves_no_connection_open(state_url: str) -> None:
    open_state_store(state_url).close()
    raw_sql(state_url, "UPDATE chain SET value = 'utxoflow-state-0' WHERE key = 'schema'")
    before = _connections(state_url)
    errors = []
    for _ in range(3):
        with pytest.raises(StorageError) as err:
            open_state_store(state_url)
        errors.append(err.value)  # kept alive, as a caller's traceback would keep the store
    assert _connections(state_url) == before


# -- block_summary (utxo status, utxo metrics) ----------------------------------------------------


def test_block_summary_counts_each_status_with_its_highest_height(state: StateStore) -> None:
    """Against a model of what was added and changed: per status, how many and the highest
    height (None for orphans, which have none)."""
    assert state.block_summary() == {}
    rng = random.Random(7)
    model: dict[bytes, tuple[BlockStatus, int | None]] = {}
    for n in range(60):
        status = rng.choice([P, A, S, ORPH, INV])
        height = None if status is ORPH else rng.randrange(1, 1000)
        add(state, n, height=height, work=None if height is None else n, status=status)
        model[h(n)] = (status, height)
    for n in rng.sample(range(60), 15):  # status changes move a block between the counts
        if model[h(n)][0] is not ORPH:
            state.update_block(h(n), status=A)
            model[h(n)] = (A, model[h(n)][1])

    want: dict[str, tuple[int, int | None]] = {}
    for status, height in model.values():
        n, top = want.get(status.value, (0, None))
        tops = [x for x in (top, height) if x is not None]
        want[status.value] = (n + 1, max(tops) if tops else None)
    assert state.block_summary() == want


def test_a_session_lock_where_the_backend_has_one(state: Any) -> None:
    """PostgreSQL: one holder of the advisory lock at a time, let go when its session closes;
    SQLite: none (the recovery manager uses a lease there)."""
    first, second = state.session_lock(0x5E55), state.session_lock(0x5E55)
    if not state.url.startswith("postgres"):
        assert first is None
        return
    try:
        assert first.hold() and first.hold()  # (kept: still its own)
        assert not second.hold()
        first.release()
        assert second.hold()
    finally:
        first.release()
        second.release()
