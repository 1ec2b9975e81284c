"""Conformance: lock records of two-phase creation (every backend)."""

from __future__ import annotations

import time
from typing import Any

from stores.utxo import UtxoStore, open_utxo_store
from tests.processes import race

TXID = b"\x42" * 32


def test_one_live_lock_per_txid(store: UtxoStore) -> None:
    lock = store.acquire_creation_lock(TXID, 3)
    assert lock is not None and lock.expected_recs == 3
    assert lock.expires_at - lock.created_at == 36_000  # 30 s + 2 s per record
    assert store.acquire_creation_lock(TXID, 3) is None  # held: the caller reports TxExists
    held = store.get_creation_lock(TXID)
    assert held == lock and held.hostname and held.process_id > 0
    assert store.acquire_creation_lock(b"\x43" * 32, 1) is not None  # other txids are free
    assert store.release_creation_lock(lock)
    assert store.get_creation_lock(TXID) is None
    assert not store.release_creation_lock(lock)  # released once only
    assert store.acquire_creation_lock(TXID, 3) is not None


def test_lock_ttl_grows_with_records_up_to_the_cap(store: UtxoStore) -> None:
    assert [store.lock_ttl(n) for n in (1, 10, 100, 135, 200, 10_000)] == [32, 50, 230, 300, 300, 300]  # type: ignore[attr-defined]


def test_a_lapsed_lock_is_taken_over_and_its_holder_cannot_release_it(store_url: str) -> None:
    fast = open_utxo_store(store_url, lock_base_ttl=0.3, lock_per_record_ttl=0.0, lock_max_ttl=0.3)
    try:
        dead = fast.acquire_creation_lock(TXID, 5)
        assert dead is not None
        assert fast.acquire_creation_lock(TXID, 5) is None
        time.sleep(0.4)  # the holder "died": its lock lapses
        assert fast.get_creation_lock(TXID) is None
        successor = fast.acquire_creation_lock(TXID, 5)
        assert successor is not None and successor.created_at > dead.created_at
        assert not fast.release_creation_lock(dead)  # the late holder cannot free the successor's
        assert fast.get_creation_lock(TXID) == successor
    finally:
        fast.close()


def _acquirer(url: str, barrier: Any, out: Any) -> None:
    try:
        store = open_utxo_store(url)
        barrier.wait(timeout=60)
        out.put(store.acquire_creation_lock(TXID, 2) is not None)
        store.close()
    except Exception as e:  # reported to the parent at once, not as a queue time-out
        out.put(repr(e))


def test_racing_acquirers_exactly_one_wins(store: UtxoStore, store_url: str) -> None:
    n = 4
    wins = race(_acquirer, [(store_url,)] * n)
    assert sorted(wins) == [False] * (n - 1) + [True]
    assert store.get_creation_lock(TXID) is not None
