"""A list's work split over processes: contiguous ranges, the first done here, each other in a
forked child that sends its results back as JSON (no pickle crosses a pipe).

Invariants:
- The result is exactly what `work(0, n)` would give in one process: ranges are contiguous and
  their results concatenated in order.
- A child that dies or fails says nothing on stderr, and its range is done again here: the
  processes are a speed-up, never a new way to fail.
- Output the caller had buffered is written once: multiprocessing flushes the standard streams
  before it forks (a child flushes what it inherited as it exits).
- Only forked children that inherit the caller's data (nothing but arguments by fork): call it
  before the process opens connections or starts threads (`utxo enqueue` checks its input
  before it opens the stores and the broker).
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

Work = Callable[[int, int], list[Any]]  # (lo, hi) → JSON-able results for items lo … hi-1


def map_ranges(n: int, processes: int, work: Work) -> list[Any]:
    """`work(lo, hi)` over contiguous ranges that cover `range(n)`, in at most `processes`
    processes; the results of all of them, in order (see the invariants)."""
    k = max(1, min(processes, n))
    bounds = [(n * i // k, n * (i + 1) // k) for i in range(k)]
    if k == 1:
        return work(0, n)
    ctx = mp.get_context("fork")
    kids: list[tuple[int, int, Connection, Any]] = []
    try:
        for lo, hi in bounds[1:]:
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(work, lo, hi, w), daemon=True)
            p.start()
            w.close()
            kids.append((lo, hi, r, p))
        out = list(work(*bounds[0]))
        for lo, hi, r, _p in kids:
            try:
                got = json.loads(r.recv_bytes())
            except (EOFError, OSError, ValueError):  # the child died or failed: its range here
                got = work(lo, hi)
            out += got
        return out
    finally:
        for _lo, _hi, r, p in kids:
            r.close()
            if p.is_alive():
                p.terminate()
            p.join()


def _child(work: Work, lo: int, hi: int, w: Connection) -> None:
    try:
        w.send_bytes(json.dumps(work(lo, hi)).encode())
    except BaseException:  # (the parent does the range again; nothing on stderr)
        pass
    finally:
        w.close()
