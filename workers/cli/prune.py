"""`utxo prune`: request a pruning run (latest height wins) and print its job, or, with `--jobs`,
the pruner's status and its last jobs (workers/pruning/pruner.py)."""

from __future__ import annotations

import time
from typing import Any

import click

from stores.state import open_state_store
from stores.state.prunejobs import COMPLETED, PENDING, RUNNING, PruneJob
from workers.cli.app import BadInput, Context, NotFound, cli, emit, log

POLL_S = 0.2


@cli.command("prune")
@click.option("--height", type=click.IntRange(min=0), default=None,
              help="Prune up to this height (default: the tip's).")
@click.option("--wait", is_flag=True, help="Return once a run has covered the height (0), or on timeout (1).")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Seconds --wait waits.")
@click.option("--jobs", "show_jobs", is_flag=True,
              help="Print the pruner's status and its last jobs instead.")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=20, show_default=True,
              help="How many jobs --jobs lists.")
@click.pass_obj
def prune_cmd(obj: Context, height: int | None, wait: bool, timeout: float, show_jobs: bool,
              limit: int) -> int:
    """Request a pruning run and print its job (JSON). A request at or below a height already
    pruned is answered by the job that pruned it; one below a waiting job's height by that job;
    a higher one replaces the waiting job. Workers run it (queue `prune`)."""
    if show_jobs and (height is not None or wait):
        raise BadInput("--jobs lists jobs: it takes no --height or --wait")
    if not show_jobs:
        obj.broker_url("; nothing was requested")  # (a request sends the run task)
    state = open_state_store(obj.settings.state_url, create=False)
    try:
        if show_jobs:
            emit(_status(state, limit))
            return 0
        if height is None:
            tip = state.tip()
            if tip is None or tip.height is None:
                raise NotFound("no block has been applied yet: nothing to prune")
            height = tip.height
        job = _request(obj, state, height)
        if not wait:
            emit(job.to_json())
            return 0
        job, done = _wait(state, job, height, timeout)
        emit(job.to_json())
        if not done:
            log(f"prune job {job.id} ({job.status}) has not covered height {height}"
                + (f": {job.error}" if job.error else ""))
        return 0 if done else 1
    finally:
        state.close()


def _request(obj: Context, state: Any, height: int) -> PruneJob:
    from workers.pruning.pruner import RUN_TASK
    from workers.runtime.app import app

    r = state.prune_request(height, obj.settings.pruner_job_timeout)
    if r.start:
        try:
            app.send_task(RUN_TASK, args=[])
        except Exception as e:  # the job waits in the slot; the next block's request sends again
            log(f"warning: could not send the run task ({type(e).__name__}: {e}); job {r.job.id} waits")
    return r.job  # type: ignore[no-any-return]


def _wait(state: Any, job: PruneJob, height: int, timeout: float) -> tuple[PruneJob, bool]:
    """Follow the job — and whichever job takes its height on: the one that replaced it, or the
    retry of a run that failed — until a completed run covers `height`."""
    deadline = time.monotonic() + timeout
    while True:
        done = state.prune_done_height()
        if done is not None and done >= height:
            jobs = state.prune_jobs(1000)
            covering = next((j for j in jobs if j.status == COMPLETED and j.height >= height), job)
            return covering, True
        now = state.prune_job(job.id) or job
        if now.status in (PENDING, RUNNING):
            job = now
        else:  # replaced, failed or skipped: a waiting or running job at the height goes on
            running, pending = state.prune_open_jobs()
            nxt = next((j for j in (running, pending) if j is not None and j.height >= height), None)
            if nxt is None and not (now.error or "").startswith("replaced by"):
                return now, False  # failed or skipped, and nothing goes on: it says why
            job = nxt or now
        if time.monotonic() >= deadline:
            return job, False
        time.sleep(POLL_S)


def _status(state: Any, limit: int) -> dict[str, Any]:
    running, pending = state.prune_open_jobs()
    return {
        "done_height": state.prune_done_height(),
        "running": None if running is None else running.to_json(),
        "pending": None if pending is None else pending.to_json(),
        "jobs": [j.to_json() for j in state.prune_jobs(limit)],
    }
