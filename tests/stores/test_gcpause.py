"""The store's batch calls pause the cyclic collector and always put it back as it was."""

from __future__ import annotations

import gc
import threading

import pytest

from stores.utxo.gcpause import gc_paused


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
