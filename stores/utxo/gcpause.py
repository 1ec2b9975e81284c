"""Pausing Python's cyclic garbage collector around a store's batch calls, and tuning it for a
process that applies blocks.

A block's create, spend and set-mined calls allocate tens of thousands of short-lived objects
(rows, metadata tuples, parent records) that hold no reference cycles: reference counting frees
every one of them. The cyclic collector still runs over them as they pile up, and measured on
`python -m bench.store` that costs about a tenth of the store's time for nothing found.

Invariants:
- The collector is paused only while at least one batch call runs, and is enabled again when
  the last one returns, unless it was already disabled when the first one started.
- Pausing never frees or keeps anything alive by itself: garbage with cycles made meanwhile is
  collected at the next collection after the pause.
- `tune_for_blocks` only spaces collections out; every collection still runs, on the same rules.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_depth = 0
_was_enabled = False


def _pause() -> None:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1


def _resume() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()


# Allocations between two youngest-generation collections in a process that applies blocks
# (Python's default is 700). A block's work allocates in bursts of tens of thousands of objects,
# most freed by reference counting within the burst; at 700 the collector ran ~300 times a
# minute over them and, through the older generations, over every parsed block kept: 7-8% of
# a store-only run (60 blocks of 2,000 txs: 0.95 s of 12 s, against 0.12 s at 50,000).
BLOCK_GC_THRESHOLD = 50_000


def tune_for_blocks() -> None:
    """Space the collector's runs out for block work (see BLOCK_GC_THRESHOLD); the older
    generations keep their default ratios."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(BLOCK_GC_THRESHOLD, older, oldest)


def gc_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """Run `fn` with the cyclic collector paused (nesting and threads are fine)."""

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        _pause()
        try:
            return fn(*args, **kwargs)
        finally:
            _resume()

    return call
