"""`utxo worker`, `beat`, `wait`, `tip`, `block`, `flower`: running and watching the pipeline
(`utxo enqueue`, feeding it, is `workers/cli/enqueue.py`)."""

from __future__ import annotations

import os
import socket
import sys
import time
from functools import partial
from typing import Any

import click

from chain import ParseError, hex_to_hash
from stores.state import BlockStatus, StateStore
from workers.cli.app import EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, BadInput, Context, NotFound, cli, emit, log
from workers.cli.progress import Reporter, WaitProgress


def _export(obj: Context) -> None:
    """Hand the CLI's setting overrides to the worker processes (they read the environment)."""
    for key, value in obj.overrides.items():
        os.environ[f"UTXO_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "FATAL"]
REFUSALS_LISTED = 20  # `utxo wait`: refusals listed on stdout (all are counted)


@cli.command("worker")
@click.option(
    "--queues", "-Q", default="blocks,txs,prune,recovery", show_default=True, help="Queues to consume."
)
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes.")
@click.option("--loglevel", "-l", default="INFO", show_default=True,
              type=click.Choice(LOG_LEVELS, case_sensitive=False))
@click.option("--name", "-n", default=None, help="Node name (default: utxo-PID@HOST; %h is the host name).")
@click.option("--prefetch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Messages each process takes ahead. Keep 1 for a worker of the `blocks` queue "
                   "(a block task runs for seconds); a `-Q txs` worker may take more.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics of this worker's processes on this port "
                   "(UTXO_METRICS_PORT; 0: none).")
@click.pass_obj
def worker_cmd(obj: Context, queues: str, concurrency: int, loglevel: str, name: str | None,
               prefetch: int, metrics_port: int | None) -> None:
    """A Celery worker of this app. It opens each store before it takes a message (a store
    that cannot work: exit 2); `celery -A workers.app worker` runs the same worker without that
    check. Exit status: 0 after SIGTERM (a warm shutdown), 1 after an unrecoverable error or
    SIGINT/SIGQUIT."""
    if metrics_port is not None:
        obj.overrides["metrics_port"] = metrics_port
    _export(obj)
    from workers.ops import multiproc  # before anything imports prometheus_client (see there)

    multiproc.prepare(obj.settings.metrics_port)
    from workers.runtime.startup import CannotStart, check_stores

    try:  # before a single message is taken (see workers/runtime/startup.py)
        check_stores(obj.settings)
    except CannotStart as e:
        raise BadInput(str(e)) from e
    from celery.utils.nodenames import default_nodename, host_format

    from workers.runtime.app import app

    node = host_format(default_nodename(name or f"utxo-{os.getpid()}@{socket.gethostname()}"))
    # `app.Worker`, as `celery worker` builds it, rather than `app.worker_main`, which drops the
    # worker's exit code: a worker that dies of an unrecoverable error must not exit 0, or a
    # supervisor restarting on failure leaves it down.
    worker = app.Worker(hostname=node, queues=queues, concurrency=concurrency, loglevel=loglevel,
                        prefetch_multiplier=prefetch, without_mingle=True, without_gossip=True)
    try:
        worker.start()
    finally:
        multiproc.cleanup()
    sys.exit(worker.exitcode or 0)


@cli.command("beat")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.pass_obj
def beat_cmd(obj: Context, loglevel: str) -> None:
    """The periodic scheduler: the re-sending scan every UTXO_REQUEUE_INTERVAL seconds (the
    schedule is celeryconfig.py's, held in memory: no schedule file). One is enough; a second
    only doubles scans, which are safe to run at once."""
    _export(obj)
    obj.broker_url()  # (and the settings) checked before starting anything
    from workers.runtime.app import app

    app.start(["beat", "-l", loglevel])


@cli.command("wait")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True, help="Seconds.")
@click.pass_obj
def wait_cmd(obj: Context, timeout: float) -> int:
    """Return once everything enqueued so far has been processed (0), or on timeout (1: what
    still waits for a missing parent is counted in "waiting" and the longest listed in
    "waiting_for", each with what it waits for); 4 when
    it was, and something was refused that no earlier wait reported (a block invalid, a
    transaction rejected, also before this wait began): each listed in "refusals" (the first
    REFUSALS_LISTED, with the rival where one holds what it wanted), counted in "refused" and
    on stderr. Progress goes to stderr: blocks and transactions done and pending, rate, time
    left."""
    from workers.runtime.registry import BlockSettled, Registry

    state = obj.open_state()
    reg = Registry(state)  # in the state store: it outlives a restart of the broker
    try:
        settled = BlockSettled(state)
        with Reporter() as rep, WaitProgress(rep, partial(_why, state)) as progress:
            # (a block the tip has passed counts as done at once, though its id is only let go
            # once the holder's pass ends)
            done = reg.wait(timeout, settled=settled,
                            progress=lambda ids: progress([i for i in ids if i not in settled.final]))
        still = reg.pending()
        finished = [i for i in reg.waited if i not in still]
        refused, mark = reg.unreported(finished)
        n_orphans, orphans = reg.orphans(REFUSALS_LISTED)
        n_waits, waits = state.waiting(None, REFUSALS_LISTED) if still else (0, {})
        if done:
            reg.reported(mark)
    finally:
        state.close()
    out: dict[str, Any] = {"done": done, "pending": len(still), "refused": len(refused)}
    if orphans:  # done, as far as a wait goes: but they wait for a parent that has not come
        out["orphans"] = n_orphans
        out["orphan_blocks"] = [{"hash": e.hash[::-1].hex(), "parent": e.parent[::-1].hex()} for e in orphans]
        log(f"{n_orphans} block(s) wait as orphans, their parent unknown: enqueue it to go on "
            f"(the last: {orphans[0].hash[::-1].hex()}, parent {orphans[0].parent[::-1].hex()})")
    if waits:  # not done: what still waits says why, where it can (a tx's missing parents)
        out["waiting"] = n_waits
        out["waiting_for"] = [{"id": i, "reason": r} for i, (r, _t) in waits.items()]
        longest, (reason, since) = next(iter(waits.items()))
        log(f"{n_waits} pending message(s) wait for what has not come; the longest: {longest} "
            f"{reason} (for {max(0.0, time.time() - since):,.0f} s)")
    if refused:
        out["refusals"] = [r.to_json() for r in refused[:REFUSALS_LISTED]]
        first = refused[0]
        log(f"{len(refused)} refused since the last wait; the first: {first.kind} {first.key}: "
            f"{first.reason[:300]}")
    emit(out)
    if not done:
        return EXIT_NOT_FOUND
    return EXIT_REFUSED if refused else EXIT_OK


def _why(state: StateStore, kind: str) -> str:
    """What pending messages of a kind wait for, for a progress line: `3 wait for missing parents`."""
    if kind != "tx":  # (blocks waiting for a parent are orphans: named when the wait ends)
        return ""
    n, _longest = state.waiting(None, 0)
    return f"{n:,} wait for missing parents" if n else ""


def _state(obj: Context) -> StateStore:
    return obj.open_state(create=False)


@cli.command("tip")
@click.pass_obj
def tip_cmd(obj: Context) -> None:
    """`{"height", "hash"}` of the best chain's applied tip."""
    state = _state(obj)
    try:
        tip = state.tip()
    finally:
        state.close()
    if tip is None:
        raise NotFound("no block has been applied yet")
    emit({"height": tip.height, "hash": tip.hash[::-1].hex()})


@cli.command("block")
@click.argument("block_hash", metavar="HASH")
@click.pass_obj
def block_cmd(obj: Context, block_hash: str) -> None:
    """A block's height and status: applied, side, orphan, invalid (with its reason), pending.

    An applied block also shows the confirmed set it left: "muhash" (MuHash3072 as Bitcoin Core's
    gettxoutsetinfo prints it), "utxos" and "satoshis"."""
    from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)

    try:
        h = hex_to_hash(block_hash)
    except (ValueError, ParseError):
        raise BadInput(f"HASH must be 64 hex digits, got {block_hash!r}") from None
    state = _state(obj)
    try:
        entry = state.get_block(h)
        made = state.get_commitment(h) if entry is not None and entry.status is BlockStatus.APPLIED else None
    finally:
        state.close()
    if entry is None:
        raise NotFound(f"block {block_hash} is not known")
    out = entry.to_json()
    if made is not None:
        out |= commitment.to_json(made)
    emit(out)


LOOPBACK = ("127.", "::1", "localhost")


@cli.command("flower")
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.option("--address", default=None, help="Listen address (UTXO_FLOWER_ADDRESS, default 127.0.0.1).")
@click.pass_obj
def flower_cmd(obj: Context, port: int, address: str | None) -> None:
    """Flower on this app. Its pages and API ask for the credentials of UTXO_FLOWER_BASIC_AUTH;
    without them it listens on loopback only (a non-loopback address is refused)."""
    _export(obj)
    obj.broker_url()  # checked before Flower starts
    s = obj.settings
    addr = address or s.flower_address
    auth = s.flower_basic_auth
    if not auth and not addr.startswith(LOOPBACK):
        raise BadInput(f"Flower on {addr} needs credentials: set UTXO_FLOWER_BASIC_AUTH=user:password")
    if auth and not all(":" in pair and pair.split(":", 1)[0] for pair in auth.split(",")):
        raise BadInput("UTXO_FLOWER_BASIC_AUTH must be user:password[,user:password…]")
    args = [
        sys.executable, "-m", "celery", "-A", "workers.runtime.app", "flower", f"--port={port}",
        f"--address={addr}",
    ]
    env = dict(os.environ)
    if auth:
        env["FLOWER_BASIC_AUTH"] = auth  # Flower reads FLOWER_* options; argv would show it in `ps`
    else:
        env["FLOWER_UNAUTHENTICATED_API"] = "true"  # loopback only (checked above)
    sys.stdout.flush()
    os.execve(sys.executable, args, env)
