"""The store's batch calls pause the cyclic collector and always put it back as it was (on
every backend: tests/stores/conftest.py)."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from stores.utxo import UtxoStore
from stores.utxo.gcpause import gc_paused
from tests.stores.helpers import child, created, funding, uhash


@gc_paused
def inside() -> bool:
    return gc.isenabled()


@gc_paused
def nested() -> tuple[bool, bool]:
    return inside(), gc.isenabled()


@gc_paused
def fails() -> None:
    raise RuntimeError("boom")


def test_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    assert inside() is False
    assert nested() == (False, False)
    assert gc.isenabled()


def test_restored_after_an_exception() -> None:
    with pytest.raises(RuntimeError):
        fails()
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        assert inside() is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_threads_overlapping_leave_it_enabled() -> None:
    barrier = threading.Barrier(4)

    @gc_paused
    def work() -> None:
        barrier.wait(timeout=10)  # all four inside at once

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert gc.isenabled()


def test_tuned_for_blocks_the_collector_runs_less_often_and_still_collects_cycles() -> None:
    import weakref

    from stores.utxo.gcpause import BLOCK_GC_THRESHOLD, tune_for_blocks

    before = gc.get_threshold()
    try:
        tune_for_blocks()
        assert gc.get_threshold() == (BLOCK_GC_THRESHOLD, *before[1:])

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        junk = [[i] for i in range(2 * BLOCK_GC_THRESHOLD)]  # allocations: a collection runs
        assert gone() is None and len(junk) == 2 * BLOCK_GC_THRESHOLD
    finally:
        gc.set_threshold(*before)


def test_every_backends_batch_calls_run_with_the_collector_paused(store: UtxoStore) -> None:
    """A block's three batch calls (create, spend, set mined) on each backend: with the
    collector set to run at every allocation, none of its collections starts while one of
    them is on the stack, and it is enabled again once they return."""
    parents = [funding(2) for _ in range(20)]
    created(store, *parents, height=100, mined=True)
    children = [child((p, 0), (p, 1)) for p in parents]
    names = {"create_many", "spend_many", "set_mined_multi"}
    inside: list[str] = []
    runs = [0]

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase != "start":
            return
        runs[0] += 1
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_name in names and "/stores/" in f.f_code.co_filename:
                inside.append(f.f_code.co_name)
                return
            f = f.f_back

    before = gc.get_threshold()
    gc.set_threshold(1)
    gc.callbacks.append(watch)
    try:
        made = store.create_many(children, 101, meta=False)
        spent = store.spend_many(children, 101)
        mined = store.set_mined_multi([c.txid for c in children], 2, 101)
        enabled_after = gc.isenabled()
        gc.collect()  # outside the calls: the watch sees it (it is live), and no store call on the stack
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*before)
    assert not any(isinstance(r, Exception) for r in (*made, *spent, *mined))
    assert runs[0] > 0
    assert inside == []
    assert enabled_after
    assert store.get_spend((parents[0].txid, 0), uhash(parents[0], 0)).spending_txid == children[0].txid
