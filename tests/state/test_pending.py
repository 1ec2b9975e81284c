"""The state store's registry of pending messages (stores/state/protocol.py, `PendingEntry`),
checked on every backend: adding (and adding again), removing, listing in registration order,
claiming for a re-send by broker run and by age (also raced by real processes), unclaiming, and
surviving a reopen."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stores.state import PendingDone, PendingEntry, StateStore, open_state_store
from tests.processes import race

RUN, OTHER = "run-a", "run-b"  # broker identities (Redis run_ids in real use)


def ident(kind: str, n: int) -> str:
    return f"{kind}:{n:064x}"


def add(state: StateStore, kind: str, n: int, run: str = RUN) -> str:
    i = ident(kind, n)
    state.add_pending(i, kind, f"{n:064x}", run)
    return i


def idents(entries: list[PendingEntry]) -> list[str]:
    return [e.ident for e in entries]


def test_fresh_store_has_nothing_pending(state: StateStore) -> None:
    assert state.pending() == []
    assert state.pending(upto=10) == []
    assert state.claim_pending(RUN, 0, 100) == []
    assert state.claim_pending(None, 0, 100) == []


def test_add_pending_is_read_back(state: StateStore) -> None:
    before = time.time()
    state.add_pending("block:" + "ab" * 32, "block", "ab" * 32, RUN)
    state.add_pending("tx:" + "cd" * 32, "tx", "cd" * 32, "")
    after = time.time()
    b, t = state.pending()
    assert (b.ident, b.kind, b.key, b.broker_run, b.sends) == (
        "block:" + "ab" * 32, "block", "ab" * 32, RUN, 1,
    )
    assert (t.ident, t.kind, t.key, t.broker_run, t.sends) == ("tx:" + "cd" * 32, "tx", "cd" * 32, "", 1)
    for e in (b, t):
        assert isinstance(e, PendingEntry) and isinstance(e.seq, int)
        assert before - 0.01 <= e.enqueued_at == e.sent_at <= after + 0.01
    assert b.seq < t.seq


def test_add_pending_refuses_an_unknown_kind(state: StateStore) -> None:
    with pytest.raises(ValueError, match="kind"):
        state.add_pending("chunk:1", "chunk", "1", RUN)
    assert state.pending() == []


def test_pending_keeps_registration_order(state: StateStore) -> None:
    ns = [9, 2, 7, 1, 8, 3]  # ids in no particular order
    added = [add(state, "tx" if n % 2 else "block", n) for n in ns]
    entries = state.pending()
    assert idents(entries) == added
    seqs = [e.seq for e in entries]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert idents(state.pending(upto=entries[2].seq)) == added[:3]
    assert idents(state.pending(upto=entries[0].seq - 1)) == []
    assert idents(state.pending(upto=entries[-1].seq + 100)) == added


def test_adding_again_keeps_the_place_and_records_the_send(state: StateStore) -> None:
    first = add(state, "block", 1)
    add(state, "block", 2)
    (old, _) = state.pending()
    time.sleep(0.02)
    add(state, "block", 1, run=OTHER)
    again, second = state.pending()
    assert idents([again, second]) == [first, ident("block", 2)]  # still first
    assert (again.seq, again.enqueued_at) == (old.seq, old.enqueued_at)
    assert (again.kind, again.key) == (old.kind, old.key)
    assert again.sent_at > old.sent_at and again.broker_run == OTHER and again.sends == 2


def test_remove_pending(state: StateStore) -> None:
    a, b, c = (add(state, "tx", n) for n in (1, 2, 3))
    state.remove_pending(b)
    assert idents(state.pending()) == [a, c]
    state.remove_pending(b)  # removing what is not there is harmless
    state.remove_pending("tx:unknown")
    assert idents(state.pending()) == [a, c]
    last_seq = state.pending()[-1].seq
    add(state, "tx", 1)  # still pending: keeps its place
    add(state, "tx", 2)  # removed, then added again: a new registration, after the others
    entries = state.pending()
    assert idents(entries) == [a, c, b] and entries[-1].seq > last_seq


def test_claim_takes_entries_sent_under_another_broker_run(state: StateStore) -> None:
    lost = [add(state, "block", n, run=OTHER) for n in range(3)]
    fresh = [add(state, "tx", n, run=RUN) for n in range(3)]
    unknown = add(state, "tx", 99, run="")  # the broker could not be asked when it was sent
    claimed = state.claim_pending(RUN, 3600, 100)
    assert idents(claimed) == [*lost, unknown]
    assert {e.broker_run for e in claimed} == {OTHER, ""}  # returned as they were before the claim
    assert all(e.sends == 1 for e in claimed)
    assert state.claim_pending(RUN, 3600, 100) == []  # marked: a second claim finds nothing due
    now = {e.ident: e for e in state.pending()}
    assert set(now) == {*lost, *fresh, unknown}
    for i in [*lost, unknown]:
        e = now[i]
        assert e.broker_run == RUN and e.sends == 2 and e.sent_at >= e.enqueued_at
    assert all(now[i].sends == 1 and now[i].broker_run == RUN for i in fresh)  # untouched


def test_claim_takes_entries_sent_too_long_ago(state: StateStore) -> None:
    old = [add(state, "tx", n) for n in range(2)]
    time.sleep(0.3)
    new = add(state, "tx", 2)
    claimed = state.claim_pending(RUN, 0.2, 100)
    assert idents(claimed) == old
    assert state.claim_pending(RUN, 0.2, 100) == []  # their sent time is now
    time.sleep(0.3)
    assert idents(state.claim_pending(RUN, 0.2, 100)) == [*old, new]  # due again, all three


def test_claim_without_a_known_broker_run_goes_by_age_only(state: StateStore) -> None:
    add(state, "tx", 1, run=OTHER)
    add(state, "tx", 2, run="")
    assert state.claim_pending(None, 3600, 100) == []  # runs are not compared
    time.sleep(0.15)
    assert len(state.claim_pending(None, 0.1, 100)) == 2
    assert {e.broker_run for e in state.pending()} == {""}  # sent under an unknown run
    assert len(state.claim_pending(RUN, 3600, 100)) == 2  # which a known run then re-sends


def test_claim_limit_goes_in_registration_order(state: StateStore) -> None:
    added = [add(state, "block", n, run=OTHER) for n in (5, 3, 8, 1, 9, 4, 7)]
    got: list[str] = []
    while batch := state.claim_pending(RUN, 3600, 3):
        assert len(batch) <= 3
        got += idents(batch)
    assert got == added


def test_claim_after_a_seq_goes_on_from_there(state: StateStore) -> None:
    added = [add(state, "tx", n, run=OTHER) for n in range(7)]
    seqs = [e.seq for e in state.pending()]
    assert idents(state.claim_pending(RUN, 3600, 2, after=seqs[2])) == added[3:5]
    time.sleep(0.02)
    # due again at once (any age counts), yet a scan going on past its last claim takes each once
    got, cursor = [], 0
    while batch := state.claim_pending(RUN, 0, 3, after=cursor):
        got += idents(batch)
        cursor = batch[-1].seq
    assert got == added
    assert state.claim_pending(RUN, 3600, 100, after=seqs[-1]) == []


def test_unclaim_makes_entries_due_at_once(state: StateStore) -> None:
    a, b, c = (add(state, "tx", n, run=OTHER) for n in (1, 2, 3))
    assert idents(state.claim_pending(RUN, 3600, 100)) == [a, b, c]
    state.remove_pending(c)
    state.unclaim_pending([a, c, "tx:never-added"])  # c is done meanwhile: left out, not re-added
    assert idents(state.pending()) == [a, b]
    ua = state.pending()[0]
    assert ua.sends == 1 and ua.broker_run == ""
    claimed = state.claim_pending(RUN, 3600, 100)  # due whatever the run and however recent
    assert idents(claimed) == [a]
    assert idents(state.claim_pending(None, 3600, 100)) == []
    state.unclaim_pending([b])
    assert idents(state.claim_pending(None, 3600, 100)) == [b]  # and with no run known, by age
    state.unclaim_pending([])  # nothing to do


def test_unclaim_many(state: StateStore) -> None:
    added = [add(state, "tx", n, run=OTHER) for n in range(1200)]  # more than one IN list
    assert len(state.claim_pending(RUN, 3600, 5000)) == 1200
    state.unclaim_pending(added)
    assert idents(state.claim_pending(RUN, 3600, 5000)) == added


def test_pending_survives_reopen_and_is_shared(state_url: str) -> None:
    s = open_state_store(state_url)
    a = add(s, "block", 1)
    b = add(s, "tx", 2, run=OTHER)
    before = s.pending()
    s.close()
    s = open_state_store(state_url)
    other = open_state_store(state_url)
    try:
        assert s.pending() == before
        assert idents(other.claim_pending(RUN, 3600, 10)) == [b]
        assert s.claim_pending(RUN, 3600, 10) == []  # the other handle's claim holds here too
        other.remove_pending(a)
        assert idents(s.pending()) == [b]
    finally:
        s.close()
        other.close()


CLAIMED_ENTRIES = 300


def _claim_racer(url: str, who: int, barrier: Any, out: Any) -> None:
    got: list[Any] = []
    try:
        store = open_state_store(url, create=False)
        barrier.wait(timeout=60)
        while batch := store.claim_pending(RUN, 3600, 7):
            got += idents(batch)
        store.close()
    except Exception as e:  # reported to the parent at once, not as a queue time-out
        got.append(repr(e))
        barrier.abort()
    finally:
        out.put((who, got))


def test_processes_claiming_at_once_never_share_an_entry(state: StateStore, state_url: str) -> None:
    """Scans on several hosts after a broker restart (all seeing the broker's new run): each
    entry lost with the old run is claimed by exactly one of them, once."""
    added = [add(state, "tx", n, run="gone") for n in range(CLAIMED_ENTRIES)]
    results = dict(race(_claim_racer, [(state_url, w) for w in range(3)]))
    everyone = [i for got in results.values() for i in got]
    assert sorted(everyone) == sorted(added), [g for g in everyone if not g.startswith("tx:")]
    assert {(e.broker_run, e.sends) for e in state.pending()} == {(RUN, 2)}



def test_pending_counts_per_kind_follow_adds_and_removes(state: StateStore) -> None:
    assert state.pending_counts() == {}
    blocks = [add(state, "block", n) for n in range(3)]
    txs = [add(state, "tx", n) for n in range(5)]
    add(state, "tx", 0)  # (added again: still one)
    assert state.pending_counts() == {"block": 3, "tx": 5}
    state.remove_pending(blocks[0])
    for t in txs:
        state.remove_pending(t, accepted=True)
    assert state.pending_counts() == {"block": 2}


def test_a_connection_lost_in_the_commit_of_an_idempotent_state_write_is_tried_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`utxo wait` settles blocks (`remove_pending`) and notes what it reported (`set_meta`) on
    a connection an operator's restart may cut at any moment, the COMMIT included. Those writes
    are idempotent, so a COMMIT lost is tried again on a new connection instead of ending the
    wait with a StorageError; a unit that is not idempotent still leaves as one (it may have
    committed). The cut is made from inside the unit, so its COMMIT is what meets it."""
    import psycopg

    import stores.state.pending as pending_module
    from stores.utxo import StorageError

    state = open_state_store(pg_url)
    db = state.db  # type: ignore[attr-defined]

    def cut() -> None:
        pid = db.backend_pid()
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                pass  # gone before the unit's COMMIT is sent

    calls = []
    real = pending_module.note_refusal

    def cut_once(*args: object) -> None:
        calls.append(args)
        real(*args)  # type: ignore[arg-type]
        if len(calls) == 1:
            cut()

    monkeypatch.setattr(pending_module, "note_refusal", cut_once)
    try:
        tx = ident("tx", 0xAB)  # (the database is the session's: look at this id only)
        state.add_pending(tx, "tx", tx[3:], "run-1")
        state.remove_pending(tx, refused=("spends a spent output", "cd" * 32))
        assert len(calls) == 2  # the first COMMIT was lost, the unit ran again
        assert tx not in {e.ident for e in state.pending()}
        got = state.refusals([tx])[tx]
        assert (got.reason, got.rival) == ("spends a spent output", "cd" * 32)
        seen = []

        def cut_first(cur: object) -> None:
            seen.append(cur)
            if len(seen) == 1:
                cut()

        with pytest.raises(StorageError, match=r"not twice failed .*AdminShutdown"):
            db.write("not twice", cut_first)
        assert len(seen) == 1
    finally:
        state.close()


def test_what_a_pending_message_waits_for_goes_with_it(state: StateStore) -> None:
    """A reason noted for a pending id is read back (the longest waiting first), noted again
    it keeps its first time; one for an id not pending is left out; finishing the message
    (refused or not) takes its reason with it in the same write."""
    a, b = add(state, "tx", 1), add(state, "tx", 2)
    state.note_waiting([(a, "waits for 1 missing parent")])
    time.sleep(0.01)
    state.note_waiting([(b, "waits for 2 missing parents"), (ident("tx", 9), "not pending")])
    n, found = state.waiting()
    assert n == 2 and list(found) == [a, b], found
    since = found[a][1]
    assert abs(since - time.time()) < 60
    state.note_waiting([(a, "waits for 3 missing parents")])
    n, found = state.waiting([a, ident("tx", 9)])
    assert n == 1 and found == {a: ("waits for 3 missing parents", since)}
    assert state.waiting(limit=1) == (2, {a: found[a]})
    state.remove_pending(a, refused=("given up", None))
    state.remove_pending_many([PendingDone(b, accepted=True)])
    assert state.waiting() == (0, {})
    assert state.waiting([a, b]) == (0, {})
