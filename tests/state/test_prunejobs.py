"""The pruner's job manager in the state store (stores/state/prunejobs.py), on every backend: the
one-job slot (latest height wins), the run lock with its lease, failing a dead or timed-out
run and running its height again, and the bounded history."""

from __future__ import annotations

import subprocess
import threading
import time

from stores.lease import holder_id
from stores.state import StateStore, open_state_store

T = 600.0  # job timeout


def test_latest_height_wins_the_slot(state: StateStore) -> None:
    a = state.prune_request(5, T)
    assert a.start and a.job.status == "pending" and a.job.height == 5
    b = state.prune_request(3, T)  # below the waiting job: it answers
    assert b.job.id == a.job.id and b.start
    c = state.prune_request(9, T)  # above: it replaces the waiting job
    assert c.job.id != a.job.id and c.job.height == 9
    old = state.prune_job(a.job.id)
    assert old is not None and old.status == "cancelled" and old.error == "replaced by a request at height 9"
    assert [j.status for j in state.prune_jobs()] == ["pending", "cancelled"]


def test_one_runner_at_a_time_and_requests_during_a_run_wait_for_it(state: StateStore) -> None:
    state.prune_request(5, T)
    job = state.prune_take("h:1:a", 30, T)
    assert job is not None and job.status == "running" and job.holder == "h:1:a"
    assert state.prune_take("h:2:b", 30, T) is None  # the lock is held
    r = state.prune_request(7, T)
    assert r.job.status == "pending" and not r.start  # the live runner takes it when it finishes
    assert state.prune_take("h:2:b", 30, T) is None
    assert state.prune_renew(job.id, "h:1:a", 30, {"seen": 1})
    assert not state.prune_renew(job.id, "h:2:b", 30, {})
    assert not state.prune_finish(job.id, "h:2:b", "completed", {})
    assert state.prune_finish(job.id, "h:1:a", "completed", {"deleted": 2})
    assert state.prune_done_height() == 5
    nxt = state.prune_take("h:1:a", 30, T)
    assert nxt is not None and nxt.id == r.job.id and nxt.height == 7
    assert state.prune_finish(nxt.id, "h:1:a", "completed", {})
    ended = state.prune_job(job.id)
    assert ended is not None and ended.figures == {"deleted": 2} and ended.ended_at is not None
    for h in (7, 6, 0):  # at or below what a run completed: answered at once by that run
        r = state.prune_request(h, T)
        assert not r.start and r.job.id == nxt.id and r.job.status == "completed"
    assert state.prune_take("h:1:a", 30, T) is None  # nothing waits


def test_a_run_whose_lease_lapsed_is_failed_and_its_height_runs_again(state: StateStore) -> None:
    state.prune_request(5, T)
    dead = state.prune_take("elsewhere:1:a", 0.05, T)  # another host: only the lease can tell
    assert dead is not None
    time.sleep(0.1)
    again = state.prune_take("h:2:b", 30, T)
    assert again is not None and again.height == 5 and again.id != dead.id and again.holder == "h:2:b"
    failed = state.prune_job(dead.id)
    assert failed is not None and failed.status == "failed" and "stopped renewing" in (failed.error or "")
    assert not state.prune_renew(dead.id, "elsewhere:1:a", 30, {})  # the old runner must stop


def test_a_run_of_a_dead_process_of_this_host_is_taken_over_at_once(state: StateStore) -> None:
    p = subprocess.Popen(["true"])
    p.wait()  # a pid that no longer runs
    state.prune_request(8, T)
    state.prune_request(4, T)
    dead = state.prune_take(holder_id().rsplit(":", 2)[0] + f":{p.pid}:x", 300, T)
    assert dead is not None and dead.height == 8
    state.prune_request(6, T)  # waits, below the dead run's height
    again = state.prune_take("h:2:b", 30, T)
    assert again is not None and again.height == 8  # the dead run's height, over the lower one
    statuses = {j.id: (j.status, j.height) for j in state.prune_jobs()}
    assert sorted(statuses.values()) == [("cancelled", 6), ("failed", 8), ("running", 8)]


def test_a_run_past_the_job_timeout_is_failed(state: StateStore) -> None:
    state.prune_request(5, T)
    slow = state.prune_take("h:1:a", 300, 0.05)
    assert slow is not None
    time.sleep(0.1)
    r = state.prune_request(6, 0.05)
    assert r.start  # its runner is past the timeout: a new one must be started
    again = state.prune_take("h:2:b", 30, 0.05)
    assert again is not None and again.height == 6
    failed = state.prune_job(slow.id)
    assert failed is not None and failed.status == "failed" and failed.error == "timed out"


def test_the_history_is_bounded_but_keeps_open_jobs(state: StateStore) -> None:
    state.prune_history = 5  # type: ignore[attr-defined]
    for h in range(1, 13):
        state.prune_request(h, T)  # each replaces the one before: 11 cancelled
    jobs = state.prune_jobs(100)
    assert [j.status for j in jobs] == ["pending"] + ["cancelled"] * 5
    assert jobs[0].height == 12
    job = state.prune_take("h:1:a", 30, T)
    assert job is not None
    for h in range(13, 20):
        state.prune_request(h, T)
    assert [j.status for j in state.prune_jobs(100)][:1] == ["pending"]
    assert any(j.status == "running" for j in state.prune_jobs(100))
    assert state.prune_finish(job.id, "h:1:a", "completed", {})
    assert state.prune_done_height() == 12
    assert len(state.prune_jobs(100)) == 6  # 5 finished + the pending one


def test_racing_requests_leave_one_pending_job_at_the_highest_height(state_url: str) -> None:
    stores = [open_state_store(state_url) for _ in range(4)]
    answers: list[tuple[int, int]] = []
    lock = threading.Lock()

    def ask(s: StateStore, heights: range) -> None:
        for h in heights:
            r = s.prune_request(h, T)
            with lock:
                answers.append((h, r.job.id))

    threads = [threading.Thread(target=ask, args=(s, range(i, 200, 4))) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = stores[0].prune_jobs(1000)
    pending = [j for j in jobs if j.status == "pending"]
    assert len(pending) == 1 and pending[0].height == 199
    by_id = {j.id: j for j in jobs}
    for h, job_id in answers:  # every request was answered by a job at its height or above
        assert by_id[job_id].height >= h
    for j in jobs:  # every cancelled job was replaced by a higher request
        if j.status == "cancelled":
            assert j.error is not None and int(j.error.rsplit(" ", 1)[1]) > j.height
    for s in stores:
        s.close()


def test_a_request_a_live_run_covers_is_answered_by_it(state: StateStore) -> None:
    state.prune_request(9, T)
    run = state.prune_take("h:1:a", 30, T)
    assert run is not None
    for h in (9, 4):
        r = state.prune_request(h, T)
        assert r.job.id == run.id and not r.start
    assert [j.status for j in state.prune_jobs()] == ["running"]


def test_a_job_left_waiting_at_a_height_a_run_completed_is_not_run(state: StateStore) -> None:
    state.prune_request(9, T)
    slow = state.prune_take("elsewhere:1:a", 0.01, T)  # its lease lapses, but it runs on
    assert slow is not None
    time.sleep(0.05)
    r = state.prune_request(9, T)  # the run is not live: a new job waits, and a runner is asked for
    assert r.start and r.job.status == "pending"
    assert state.prune_finish(slow.id, "elsewhere:1:a", "completed", {})  # it finished after all
    assert state.prune_take("h:2:b", 30, T) is None  # height 9 is done: the waiting job is not run
    waiting = state.prune_job(r.job.id)
    assert waiting is not None and waiting.status == "cancelled"
    assert waiting.error == "covered by the run that completed height 9"
