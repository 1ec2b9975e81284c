"""The recovery manager's claims in the state store (stores/state/recovery.py), on every backend:
entries added with their tx's pending message, claims by age and lease (raced by real
processes), releases only by the claim's holder, terminal statuses that never change, outcomes
counted once, and the summary `utxo recover` prints."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stores.state import StateStore, open_state_store
from tests.processes import race


def key(n: int) -> str:
    return f"{n:064x}"


def test_a_tx_enqueued_gets_a_pending_entry_once(state: StateStore) -> None:
    state.add_pending(f"tx:{key(1)}", "tx", key(1), "run")
    state.add_pending(f"tx:{key(1)}", "tx", key(1), "run")  # sent again
    state.add_pending(f"block:{key(2)}", "block", key(2), "run")  # blocks are the sequencer's
    e = state.recovery_entry(f"tx:{key(1)}")
    assert e is not None
    assert (e.kind, e.key, e.status, e.attempts, e.accepted) == ("tx", key(1), "pending", 0, False)
    assert state.recovery_entry(f"block:{key(2)}") is None
    assert state.recovery_summary()["states"] == {"tx": {"pending": 1}}


def test_a_release_notes_a_record_seen(state: StateStore) -> None:
    state.recovery_add("tx", [key(1), key(2)])
    one, two = state.recovery_claim("h", 30, 0, 10)
    assert state.recovery_release(one.ident, "h", "unmined", accepted=True)
    assert state.recovery_release(two.ident, "h", "not found")
    again = {e.ident: e for e in state.recovery_claim("h2", 30, 0, 10)}
    assert again[one.ident].accepted and not again[two.ident].accepted
    assert state.recovery_release(one.ident, "h2", "unmined")  # not taken back by a later release
    e = state.recovery_entry(one.ident)
    assert e is not None and e.accepted


def test_remove_pending_notes_an_accepted_tx(state: StateStore) -> None:
    for n in (1, 2):
        state.add_pending(f"tx:{key(n)}", "tx", key(n), "run")
    state.remove_pending(f"tx:{key(1)}", accepted=True)
    state.remove_pending(f"tx:{key(2)}")
    one, two = state.recovery_entry(f"tx:{key(1)}"), state.recovery_entry(f"tx:{key(2)}")
    assert one is not None and one.accepted and two is not None and not two.accepted
    assert state.pending() == []


def test_add_keeps_known_entries_and_refuses_unknown_kinds(state: StateStore) -> None:
    assert state.recovery_add("creation", [key(1), key(2)]) == 2
    assert state.recovery_add("creation", [key(2), key(3)]) == 1
    with pytest.raises(ValueError, match="kind"):
        state.recovery_add("block", [key(9)])
    assert state.recovery_summary()["states"] == {"creation": {"pending": 3}}


def test_claims_take_only_entries_older_than_the_ttl(state: StateStore) -> None:
    state.recovery_add("tx", [key(1)])
    assert state.recovery_claim("h1", 30, older_than_s=60, limit=10) == []
    time.sleep(0.05)
    (e,) = state.recovery_claim("h1", 30, older_than_s=0.01, limit=10)
    assert (e.ident, e.holder, e.attempts) == (f"tx:{key(1)}", "h1", 1)
    assert e.lease_until > time.time() + 25


def test_a_leased_entry_is_not_claimed_again_until_its_lease_expires(state: StateStore) -> None:
    state.recovery_add("tx", [key(1), key(2)])
    first = state.recovery_claim("h1", 0.3, 0, 10)
    assert [e.key for e in first] == [key(1), key(2)]
    assert state.recovery_claim("h2", 30, 0, 10) == []
    time.sleep(0.35)
    again = state.recovery_claim("h2", 30, 0, 10)
    assert [(e.key, e.holder, e.attempts) for e in again] == [(key(1), "h2", 2), (key(2), "h2", 2)]
    assert not state.recovery_release(f"tx:{key(1)}", "", "unmined")  # nobody's claim is no claim
    # the expired holder can no longer release what the new one holds
    assert not state.recovery_release(f"tx:{key(1)}", "h1", "confirmed at 5", "confirmed")
    assert state.recovery_release(f"tx:{key(1)}", "h2", "unmined")
    e = state.recovery_entry(f"tx:{key(1)}")
    assert e is not None and (e.status, e.holder, e.lease_until, e.outcome) == ("pending", "", 0, "unmined")


def test_claims_go_least_recently_checked_first_and_respect_the_limit(state: StateStore) -> None:
    state.recovery_add("tx", [key(n) for n in range(1, 6)])
    first = state.recovery_claim("h1", 30, 0, 2)
    assert [e.key for e in first] == [key(1), key(2)]
    for e in first:
        assert state.recovery_release(e.ident, "h1", "unmined")
    rest = state.recovery_claim("h2", 30, 0, 10)
    # never checked before checked; a released entry is due again at once (the next scan)
    assert [e.key for e in rest] == [key(3), key(4), key(5), key(1), key(2)]


def test_terminal_entries_never_change_and_are_never_claimed(state: StateStore) -> None:
    state.recovery_add("tx", [key(1), key(2), key(3)])
    claims = state.recovery_claim("h1", 30, 0, 10)
    for e, status in zip(claims, ("confirmed", "deleted", "orphan"), strict=True):
        assert state.recovery_release(e.ident, "h1", f"{status}: test", status)
    for e in claims:
        for status in ("pending", "confirmed", "orphan"):
            assert not state.recovery_release(e.ident, "h1", "again", status)
    time.sleep(0.01)
    assert state.recovery_claim("h2", 0, 0, 10) == []
    assert state.recovery_add("tx", [key(1)]) == 0  # an ident seen before stays where it is
    assert state.recovery_summary()["states"] == {"tx": {"confirmed": 1, "deleted": 1, "orphan": 1}}
    with pytest.raises(ValueError, match="status"):
        state.recovery_release(claims[0].ident, "h1", "x", "gone")


def test_a_finished_creation_is_removed_and_may_be_found_again(state: StateStore) -> None:
    state.recovery_add("creation", [key(7)])
    (e,) = state.recovery_claim("h1", 30, 0, 10)
    assert state.recovery_release(e.ident, "h1", "finished", "done")
    assert state.recovery_entry(e.ident) is None
    assert state.recovery_add("creation", [key(7)]) == 1


def test_outcomes_are_counted_once_per_release_taken(state: StateStore) -> None:
    state.recovery_add("tx", [key(1), key(2)])
    state.recovery_add("creation", [key(3)])
    claims = {e.kind + e.key: e for e in state.recovery_claim("h1", 30, 0, 10)}
    assert state.recovery_release(f"tx:{key(1)}", "h1", "not found: no record, no blob")
    assert state.recovery_release(f"tx:{key(2)}", "h1", "confirmed: at 7", "confirmed")
    assert not state.recovery_release(f"tx:{key(2)}", "h1", "confirmed: at 7", "confirmed")
    assert state.recovery_release(f"creation:{key(3)}", "h1", "finished", "done")
    assert len(claims) == 3
    s = state.recovery_summary(last=5)
    assert s["outcomes"] == {"creation": {"finished": 1}, "tx": {"confirmed": 1, "not found": 1}}
    assert [r["ident"] for r in s["last"]] == [f"tx:{key(2)}", f"tx:{key(1)}"]  # newest first
    assert s["last"][0]["status"] == "confirmed" and s["last"][0]["outcome"] == "confirmed: at 7"


def test_entries_outlive_a_reopen(state_url: str) -> None:
    s = open_state_store(state_url)
    s.recovery_add("tx", [key(1)])
    (e,) = s.recovery_claim("h1", 30, 0, 1)
    s.close()
    s = open_state_store(state_url)
    got = s.recovery_entry(e.ident)
    assert got is not None and got.holder == "h1" and got.attempts == 1
    s.close()


RACED = 400


def _claimer(url: str, who: int, barrier: Any, out: Any) -> None:
    got: list[str] = []
    try:
        store = open_state_store(url, create=False)
        barrier.wait(timeout=60)
        while batch := store.recovery_claim(f"racer{who}", 60, 0, 9):
            got += [e.ident for e in batch]
        store.close()
    except Exception as e:  # reported to the parent at once, not as a queue time-out
        got.append(repr(e))
        barrier.abort()
    finally:
        out.put(got)


def test_claims_raced_by_processes_hand_each_entry_to_one(state: StateStore) -> None:
    state.recovery_add("tx", [key(n) for n in range(RACED)])
    results = race(_claimer, [(state.url, i) for i in range(4)])
    claimed = [i for r in results for i in r]
    assert sorted(claimed) == sorted(f"tx:{key(n)}" for n in range(RACED))
    assert len(set(claimed)) == RACED


def test_steps_outcomes_are_counted_beside_the_claims(state: StateStore) -> None:
    state.recovery_count("message", "given back", 2)
    state.recovery_count("message", "given back", 3)
    state.recovery_count("block", "chain taken up")
    state.recovery_count("block", "chain taken up", 0)  # nothing to count: nothing written
    assert state.recovery_summary()["outcomes"] == {
        "block": {"chain taken up": 1}, "message": {"given back": 5},
    }
