"""Workers scaled out and in mid-run, as an autoscaler does (deploy/k8s-autoscale): one worker,
then four, then one again, with real `utxo worker` processes. Scale-in is Celery's warm shutdown
(SIGTERM, what Kubernetes sends a pod it removes): each worker told to stop finishes or hands back
what it holds and exits 0, the chain's lease is let go rather than left to lapse (120 s), and the
chain goes on within seconds. The end equals the model: every block applied once, the mempool's
transactions in the store once, nothing pending."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from itertools import pairwise

import pytest

from tests.pipeline.chains import outpoints
from tests.pipeline.test_redis_restart import (
    chain_and_mempool,
    check_complete,
    tip_height,
    wait_result,
    wait_start,
)
from tests.pipeline.workers import Pipeline, faults, pipeline_fixture, until  # noqa: F401  (fixture)
from workers.chainstate.chainlease import LEASE

BLOCK_DELAY = 0.25  # s before each block is planned: the chain outlasts the scaling (tests/faults)


class TipWatch:
    """The applied tip's height, read every 50 ms from a thread: when each height was first seen."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.seen: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            h = tip_height(self.pipeline)
            if not self.seen or h > self.seen[-1][1]:
                self.seen.append((time.monotonic(), h))
            self.stop.wait(0.05)

    def longest_wait_after(self, t: float) -> float:
        """The longest time the tip stood still after `t`, until it reached its last height."""
        times = [t] + [s for s, _h in self.seen if s > t]
        return max((b - a for a, b in pairwise(times)), default=0.0)


def holding(pipeline: Pipeline, workers: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes] | None:
    """The worker whose pool child holds the chain's lease now (its holder is host:pid:token; a
    worker runs in a process group of its own), or None."""
    state = pipeline.open_state()
    try:
        holder = state.lease_holder(LEASE)
    finally:
        state.close()
    if holder is None:
        return None
    try:
        group = os.getpgid(int(holder.split(":")[1]))
    except (ProcessLookupError, ValueError, IndexError):
        return None
    return next((p for p in workers if p.pid == group), None)


@pytest.fixture
def watched(pipeline: Pipeline) -> Iterator[Pipeline]:
    pipeline.env.update(faults(block_delay=BLOCK_DELAY))
    yield pipeline


@pytest.mark.timeout(240)
def test_one_then_four_then_one_worker_loses_nothing_and_never_stalls(watched: Pipeline) -> None:
    pipeline = watched
    n_blocks, n_txs = 40, 150
    chain, funds, mempool = chain_and_mempool(pipeline, n_blocks, n_txs)
    first = chain.height - n_blocks

    w1 = pipeline.start_worker("w1")
    pipeline.enqueue("tx", [t.raw for t in mempool])
    pipeline.enqueue("block", chain.blocks)
    waiter = wait_start(pipeline, 200)
    watch = TipWatch(pipeline)
    try:
        until(lambda: tip_height(pipeline) >= first + 2, 60, 0.02, "the first blocks applied")
        added = [pipeline.start_worker(f"w{k}") for k in (2, 3, 4)]  # 1 → 4
        until(lambda: tip_height(pipeline) >= first + 12, 90, 0.02, "the chain going on with four")
        # 4 → 1, the chain's holder among those told to stop
        holder = until(lambda: holding(pipeline, [w1, *added]), 30, 0.01, "a worker holding the chain")
        told = [holder, *[p for p in [w1, *added] if p is not holder][:2]]
        (left,) = [p for p in [w1, *added] if p not in told]
        at = tip_height(pipeline)
        scaled_in = time.monotonic()
        for p in told:
            p.send_signal(signal.SIGTERM)  # Celery's warm shutdown
        codes = [p.wait(timeout=60) for p in told]
        assert codes == [0, 0, 0], pipeline.logs()  # each finished what it held and left
        assert at < chain.height - 1, "the scale-in was meant to land mid-run"
        code, out = wait_result(waiter, 200)
        assert (code, out) == (0, {"done": True, "pending": 0, "refused": 0}), pipeline.logs()
    finally:
        watch.stop.set()
        watch.thread.join()
    check_complete(pipeline, chain, outpoints(funds), mempool)
    assert left.poll() is None, pipeline.logs()  # the one left runs on
    # the chain never waited for a lease to lapse: at most a few blocks' time between heights
    stood = watch.longest_wait_after(scaled_in)
    assert stood < 10, (stood, watch.seen)
    for name in ("w2", "w3", "w4"):  # the workers added took part
        assert "Task utxoflow." in pipeline.log(name), pipeline.log(name)
