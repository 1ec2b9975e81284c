"""The chunk board (stores/state/chunks.py), on every state backend: posting, claiming (one
holder per unit, also raced by real processes), lapsed and taken-over claims, results, cancelling
and the run id that keeps a late helper out."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from stores.state import StateStore, open_state_store
from stores.state.chunks import CANCELLED, DONE, HELD, TODO
from tests.processes import race

B = hashlib.sha256(b"block").digest()
SPECS = [{"start": i * 10, "end": i * 10 + 10} for i in range(5)]


def test_units_are_claimed_once_each_in_order(state: StateStore) -> None:
    state.post_units(B, "spend", "r1", SPECS)
    got = [state.claim_unit(B, "spend", "r1", f"w{i}", 60) for i in range(5)]
    assert [u.idx for u in got if u] == [0, 1, 2, 3, 4]
    assert [u.spec for u in got if u] == SPECS
    assert state.claim_unit(B, "spend", "r1", "w9", 60) is None
    states = state.unit_states(B, "spend", "r1")
    assert [(u.state, u.holder) for u in states] == [(HELD, f"w{i}") for i in range(5)]


def test_results_are_written_by_the_holder_only(state: StateStore) -> None:
    state.post_units(B, "create", "r1", SPECS[:2])
    u = state.claim_unit(B, "create", "r1", "w1", 60)
    assert u is not None
    assert state.finish_unit(B, "create", "r1", u.idx, "stranger", {"x": 1}) is False
    assert state.finish_unit(B, "create", "r1", u.idx, "w1", {"skipped": 3, "defer": [7]}) is True
    assert state.finish_unit(B, "create", "r1", u.idx, "w1", {"x": 2}) is False  # done stays done
    first, second = state.unit_states(B, "create", "r1")
    assert (first.state, first.result) == (DONE, {"skipped": 3, "defer": [7]})
    assert (second.state, second.result) == (TODO, None)


def test_a_unit_given_back_is_claimed_again(state: StateStore) -> None:
    state.post_units(B, "mine", "r1", SPECS[:1])
    u = state.claim_unit(B, "mine", "r1", "w1", 60)
    assert u is not None and state.claim_unit(B, "mine", "r1", "w2", 60) is None
    assert state.finish_unit(B, "mine", "r1", 0, "w1", None) is True
    again = state.claim_unit(B, "mine", "r1", "w2", 60)
    assert again is not None and again.idx == 0


def test_a_lapsed_claim_is_taken_and_the_old_holder_cannot_finish(state: StateStore) -> None:
    state.post_units(B, "spend", "r1", SPECS[:1])
    assert state.claim_unit(B, "spend", "r1", "slow", 0.05) is not None
    assert state.claim_unit(B, "spend", "r1", "w2", 60) is None
    time.sleep(0.1)
    u = state.claim_unit(B, "spend", "r1", "w2", 60)
    assert u is not None and u.idx == 0
    assert state.finish_unit(B, "spend", "r1", 0, "slow", {"late": True}) is False
    assert state.finish_unit(B, "spend", "r1", 0, "w2", {}) is True


def test_a_gone_holder_is_taken_over_at_once(state: StateStore) -> None:
    state.post_units(B, "spend", "r1", SPECS[:2])
    assert state.claim_unit(B, "spend", "r1", "dead", 600) is not None
    u = state.claim_unit(B, "spend", "r1", "w2", 60, take_over="dead")
    assert u is not None and u.idx == 0  # the dead holder's unit before the unclaimed one
    assert state.unit_states(B, "spend", "r1")[0].holder == "w2"


def test_cancel_stops_unclaimed_units_only(state: StateStore) -> None:
    state.post_units(B, "spend", "r1", SPECS[:3])
    held = state.claim_unit(B, "spend", "r1", "w1", 60)
    assert held is not None
    state.cancel_units(B, "spend", "r1")
    assert state.claim_unit(B, "spend", "r1", "w2", 60) is None
    assert [u.state for u in state.unit_states(B, "spend", "r1")] == [HELD, CANCELLED, CANCELLED]
    assert state.finish_unit(B, "spend", "r1", held.idx, "w1", {"refused": "why"}) is True


def test_a_new_posting_replaces_the_old_and_a_late_helper_finds_nothing(state: StateStore) -> None:
    state.post_units(B, "spend", "old", SPECS)
    state.post_units(B, "spend", "new", SPECS[:2])
    assert state.claim_unit(B, "spend", "old", "late", 60) is None
    assert state.unit_states(B, "spend", "old") == []
    assert len(state.unit_states(B, "spend", "new")) == 2
    state.post_units(B, "mine", "m", SPECS[:1])  # another phase of the same block is separate
    state.drop_units(B, "spend")
    assert state.unit_states(B, "spend", "new") == []
    assert len(state.unit_states(B, "mine", "m")) == 1
    state.drop_units(B)
    assert state.unit_states(B, "mine", "m") == []


def _claimer(url: str, who: str, barrier: Any, out: Any) -> None:
    s = open_state_store(url)
    try:
        barrier.wait()
        mine = []
        while (u := s.claim_unit(B, "spend", "race", who, 60)) is not None:
            mine.append(u.idx)
            s.finish_unit(B, "spend", "race", u.idx, who, {"by": who})
        out.put((who, mine))
    finally:
        s.close()


def test_processes_racing_claim_each_unit_exactly_once(state: StateStore, state_url: str) -> None:
    n = 60
    state.post_units(B, "spend", "race", [{"i": i} for i in range(n)])
    results = dict(race(_claimer, [(state_url, f"p{i}") for i in range(4)]))
    claimed = sorted(i for idxs in results.values() for i in idxs)
    assert claimed == list(range(n))  # every unit once: none twice, none lost
    units = state.unit_states(B, "spend", "race")
    assert all(u.state == DONE and u.result == {"by": u.holder} for u in units)
