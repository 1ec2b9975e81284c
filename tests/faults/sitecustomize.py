"""Faults injected into the processes a test starts, from outside the code under test: with this
folder on PYTHONPATH (tests/pipeline/workers.py `faults`), Python loads this module at start-up,
and when the environment asks for a fault, the function at that point is wrapped as its module
is imported. No production module reads a test's environment.

- UTXOFLOW_TEST_PARK=POINT (and UTXOFLOW_TEST_PARK_FILE=PATH): the process parks at POINT —
  writes "PID POINT" to PATH, then sleeps until it is killed:
  `tx_spent` (mempool txs spent, their records not made yet: `workers.chainstate.mempool.make_records`),
  `conflict_swap` (a swap's tx marked conflicting, its spends still held: `Conflicts._mark`),
  `recovery_handle` (a recovery claim taken, not handled: `workers.recovery.handlers.handle`),
  `block_received` (a block message taken, not noted as this worker's: the task_received hook),
  `block_indexed` (a block indexed, the orphans below it not placed yet: `BlockIndex._place_below`).
- UTXOFLOW_TEST_PRUNE_UNIT_DELAY=S: a pruning run waits S seconds at each renewal of its job
  (after each unit), so that a test can kill it mid-run on any machine.
- UTXOFLOW_TEST_BLOCK_DELAY=S: the chain's holder waits S seconds before planning each block
  (`BlockApplier.plan`), so that a chain takes long enough for a test to scale workers mid-run.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

POINT = os.environ.get("UTXOFLOW_TEST_PARK")
DELAY = float(os.environ.get("UTXOFLOW_TEST_PRUNE_UNIT_DELAY") or 0)
BLOCK_DELAY = float(os.environ.get("UTXOFLOW_TEST_BLOCK_DELAY") or 0)


def park() -> None:
    marker = os.environ.get("UTXOFLOW_TEST_PARK_FILE")
    if marker:
        Path(marker).write_text(f"{os.getpid()} {POINT}\n")
    while True:
        time.sleep(3600)


def before(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        park()
        return fn(*args, **kwargs)

    return wrapped


def after(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        park()
        return out

    return wrapped


def _mempool(m: ModuleType) -> None:
    m.make_records = before(m.make_records)


def _conflicts(m: ModuleType) -> None:
    m.Conflicts._mark = after(m.Conflicts._mark)


def _handlers(m: ModuleType) -> None:
    m.handle = before(m.handle)


def _blockindex(m: ModuleType) -> None:
    m.BlockIndex._place_below = before(m.BlockIndex._place_below)


def _hooks(m: ModuleType) -> None:
    from celery.signals import task_received

    noted = m.note_taken
    task_received.disconnect(noted)

    def note_taken(request: Any = None, **kwargs: Any) -> None:
        if getattr(request, "name", None) == "utxoflow.block.arrived":
            park()
        noted(request=request, **kwargs)

    m.note_taken = note_taken
    task_received.connect(note_taken, weak=False)


def _prunerun(m: ModuleType) -> None:
    renew = m.PruneRun.renew

    @functools.wraps(renew)
    def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = renew(self, *args, **kwargs)
        time.sleep(DELAY)
        return out

    m.PruneRun.renew = slow


def _blockapply(m: ModuleType) -> None:
    plan = m.BlockApplier.plan

    @functools.wraps(plan)
    def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(BLOCK_DELAY)
        return plan(self, *args, **kwargs)

    m.BlockApplier.plan = slow


PARKS = {"tx_spent": ("workers.chainstate.mempool", _mempool),
         "conflict_swap": ("workers.chainstate.conflicts", _conflicts),
         "recovery_handle": ("workers.recovery.handlers", _handlers),
         "block_received": ("workers.hooks", _hooks),
         "block_indexed": ("workers.chainstate.blockindex", _blockindex)}
PATCHES: dict[str, Callable[[ModuleType], None]] = {}
if POINT:
    if POINT not in PARKS:
        raise SystemExit(f"tests/faults: no park point {POINT!r} (one of {sorted(PARKS)})")
    module, patch = PARKS[POINT]
    PATCHES[module] = patch
if DELAY:
    PATCHES["workers.pruning.prunerun"] = _prunerun
if BLOCK_DELAY:
    PATCHES["workers.chainstate.blockapply"] = _blockapply


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds a patched module as the other finders do, and patches it once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module  # type: ignore[union-attr]

                def exec_module(module: ModuleType, run: Callable[[ModuleType], None] = run) -> None:
                    run(module)
                    PATCHES[name](module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
                return spec
        return None


if PATCHES:
    sys.meta_path.insert(0, _PatchOnImport())
