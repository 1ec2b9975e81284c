"""Reorgs under faults, through real workers: a worker killed (SIGKILL) in the middle of a
conflict swap, on the way to the heavier branch and on the way back (the finishing worker takes
the block back and applies it again); random block trees applied by four workers on
PostgreSQL while their connections are terminated at random points. The chain always ends as
the model says."""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path

import psycopg
import pytest

from chain import parse_block
from tests.conftest import PG_ADMIN
from tests.pipeline.test_reorg_workers import check_branch, check_tree, conflicting, seed_tree, story
from tests.pipeline.trees import Tree, make_tree
from tests.pipeline.workers import Pipeline, children, faults, pipeline_fixture, until  # noqa: F401
from workers.chainstate.sequencer import APPLYING


def park_env(path: Path) -> dict[str, str]:
    """A worker's environment that parks the process making a conflict swap, once it has marked
    the first transaction conflicting and before it released that one's spends
    (`workers.chainstate.conflicts.Conflicts._mark`), writing its pid to `path`."""
    return faults("conflict_swap", path)


def kill_when_parked(pipeline: Pipeline, worker_index: int, marker: Path) -> None:
    """Wait until a pool child of worker `worker_index` is parked in a swap; SIGKILL the worker
    whole (its process group)."""
    text = until(lambda: marker.exists() and marker.read_text(), 60, 0.05, "a worker parked in a swap")
    pid = int(text.split()[0])
    w = pipeline.workers[worker_index]
    assert pid in children(w.pid), (pid, w.pid)
    os.killpg(w.pid, signal.SIGKILL)
    w.wait()


@pytest.mark.parametrize("where", ["to_the_heavier_branch", "back_again"])
@pytest.mark.timeout(240)
def test_worker_killed_in_the_middle_of_a_conflict_swap(pipeline: Pipeline, where: str) -> None:
    """The story of `test_reorg_workers`; the worker applying the block whose spend makes y
    conflicting (B wins), or whose reclaim of y makes y2 conflicting (A wins again), is killed
    between marking and releasing. Another worker takes the half-applied block back (giving
    the swapped transactions what they had) and applies the chain; y and its child, y2 and its
    child end as the winning branch says, and the way on is clear."""
    s = story(pipeline)
    marker = pipeline.tmp / "parked"
    if where == "to_the_heavier_branch":
        pipeline.start_worker("w1", env=park_env(marker))
        pipeline.enqueue("block", s.a.blocks)
        pipeline.wait()
        check_branch(pipeline, s.a, s.base)
        pipeline.enqueue("block", s.b.blocks[1:])
        kill_when_parked(pipeline, 0, marker)
        pipeline.start_worker("w2")
        pipeline.wait()
    else:
        pipeline.start_worker("w1")
        pipeline.enqueue("block", s.a.blocks)  # A applied first: B's arrival is a reorg (both in one
        pipeline.wait()  # enqueue, the index would know B before A's first block is applied)
        pipeline.enqueue("block", s.b.blocks[1:])
        pipeline.wait()
        pipeline.stop()  # warm: w1 is done with everything
        pipeline.start_worker("w2", env=park_env(marker))
    check_branch(pipeline, s.b, s.base)
    assert conflicting(pipeline, s.y, s.yc, s.y2, s.y2c) == [True, True, False, False]

    pipeline.enqueue("block", s.a_more)
    if where == "back_again":
        kill_when_parked(pipeline, 1, marker)
        pipeline.start_worker("w3")
    pipeline.wait()
    s.a.blocks += s.a_more
    s.a.txs += [parse_block(r).txs for r in s.a_more]
    check_branch(pipeline, s.a, s.base)
    assert conflicting(pipeline, s.y, s.yc, s.y2, s.y2c) == [False, False, True, True]
    assert pipeline.state_counts() == {"applied": 7, "side": 4}
    logs = pipeline.logs()
    assert "left half applied" in logs, logs
    assert "Traceback" not in logs and "given up" not in logs, logs


class Terminator(threading.Thread):
    """Terminates connections to database `db` (`pg_terminate_backend`) every tenth of a
    second until stopped: one at random (three times in four) or every one, whatever it is doing
    (workers applying a block, `utxo enqueue` registering, `utxo wait` polling)."""

    def __init__(self, db: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.db, self.rnd = db, random.Random(seed)
        self.halt = threading.Event()
        self.killed = 0

    def run(self) -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            while not self.halt.wait(self.rnd.uniform(0.02, 0.25)):
                limit = "LIMIT 1" if self.rnd.random() < 0.75 else ""
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM pg_stat_activity"
                    f" WHERE datname = %s AND pid <> pg_backend_pid() ORDER BY random() {limit}) AS v",
                    (self.db,),
                ).fetchone()
                self.killed += row[0] if row else 0

    def stop(self) -> int:
        self.halt.set()
        self.join()
        return self.killed


def terminated_run(pipeline: Pipeline, db_url: str, seed: int) -> tuple[Tree, int]:
    """Random tree `seed` applied on PostgreSQL by four workers at concurrency 2, enqueued in
    its random arrival order in three parts, connections terminated throughout; (the tree, how
    many connections were terminated)."""
    pipeline.use_postgres(db_url)
    tree = make_tree(seed, max_len=10)
    seed_tree(pipeline, tree)
    for k in range(4):
        pipeline.start_worker(f"w{k}", concurrency=2)
    killer = Terminator(db_url.rsplit("/", 1)[1], seed)
    killer.start()
    try:
        for part in tree.parts():
            pipeline.enqueue("block", part)
        pipeline.wait(240)
    finally:
        killed = killer.stop()
    return tree, killed


def check_terminated_run(pipeline: Pipeline, tree: Tree, killed: int) -> None:
    """The stores equal the tree's model (which a calm single-process run is held to in
    test_reorg_fuzz), whatever the kills hit; the workers lived through them."""
    assert killed >= 10, f"only {killed} connections terminated: the run was too calm to mean anything"
    check_tree(pipeline, tree)
    state = pipeline.open_state()
    try:
        assert state.get_meta(APPLYING) is None
    finally:
        state.close()
    assert all(p.poll() is None for p in pipeline.workers), pipeline.logs()
    logs = pipeline.logs()
    assert "given up" not in logs, logs
    assert "terminating connection" in logs, "no worker met a terminated connection"


@pytest.mark.parametrize("seed", [5, 12])
@pytest.mark.timeout(400)
def test_connections_terminated_while_four_workers_apply_a_tree(
    pipeline: Pipeline, pg_database: str, seed: int
) -> None:
    tree, killed = terminated_run(pipeline, pg_database, seed)
    check_terminated_run(pipeline, tree, killed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 130))
@pytest.mark.timeout(600)
def test_connections_terminated_more_trees(pipeline: Pipeline, pg_database: str, seed: int) -> None:
    tree, killed = terminated_run(pipeline, pg_database, seed)
    check_terminated_run(pipeline, tree, killed)
