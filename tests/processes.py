"""Real processes for race tests: start several at a barrier, collect what each reports."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any


def race(target: Callable[..., None], args: Sequence[tuple[Any, ...]], timeout: float = 120) -> list[Any]:
    """Run `target(*a, barrier, out)` for each `a` in a spawned process of its own; every process
    meets the others at `barrier` before its racing step and puts exactly one result on `out`.
    Returns the results in the order they arrived; every process must exit cleanly."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(args)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, out)) for a in args]
    for p in procs:
        p.start()
    results = [out.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results
