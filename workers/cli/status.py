"""`utxo status` (one screen of the deployment, for a person; `--json` for scripts; `--watch`)
and `utxo metrics` (the same snapshot as Prometheus metrics, printed once or served on a port).
Both read workers/monitor/cluster.py's snapshot: state store and broker, nothing else. `utxo
dead-letters` lists (and drops) the messages workers set aside (workers/broker/kombu_fix.py)."""

from __future__ import annotations

import time
from typing import Any

import click

from workers.cli.app import BadInput, Context, cli, emit

NOTHING_HERE = "no utxoflow deployment found"


def _take(obj: Context, window: int) -> dict[str, Any]:
    from workers.monitor.cluster import take

    return take(obj.settings, window)


def _failed(snap: dict[str, Any]) -> str | None:
    """One line naming every source that could not be read (None: all could)."""
    errors = snap["errors"]
    if not errors:
        return None
    what = "; ".join(f"{k}: {v}" for k, v in errors.items())
    return f"{NOTHING_HERE}: {what}" if "chain" not in snap and "queues" not in snap else what


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the screen.")
@click.option("--watch", type=click.FloatRange(min=0.5), default=None, is_flag=False, flag_value=2.0,
              metavar="[SECONDS]", help="Refresh every SECONDS (default 2) until Ctrl-C.")
@click.option("--window", type=click.IntRange(10, 300), default=60, show_default=True,
              help="Seconds the rates are taken over.")
@click.pass_obj
def status_cmd(obj: Context, as_json: bool, watch: float | None, window: int) -> int:
    """Tip, lag, rates over the last minute, queues, workers seen, pruner and recovery state.
    Exit 2 (and one line on stderr) when the state store or the broker cannot be read."""
    if watch is not None:
        return _watch(obj, as_json, watch, window)
    snap = _take(obj, window)
    if as_json:
        emit(snap)
    else:
        from workers.monitor.screen import render

        _console().print(render(snap))
    failed = _failed(snap)
    if failed:
        raise BadInput(failed)
    return 0


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


def _watch(obj: Context, as_json: bool, every: float, window: int) -> int:
    from rich.live import Live

    from workers.monitor.screen import render

    _stop_on_sigterm()
    first = _take(obj, window)
    if "chain" not in first and "queues" not in first:  # nothing to watch: a wrong URL, say
        if as_json:
            emit(first)
        raise BadInput(_failed(first) or NOTHING_HERE)
    try:
        if as_json:  # JSON lines, one per refresh
            snap = first
            while True:
                emit(snap)
                time.sleep(every)
                snap = _take(obj, window)
        with Live(render(first), console=_console(), auto_refresh=False) as live:
            while True:
                time.sleep(every)
                live.update(render(_take(obj, window)), refresh=True)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) is how watching ends: not an error
        return 0


def _stop_on_sigterm() -> None:
    import signal

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


@cli.command("metrics")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Serve /metrics on this port until stopped (default: print them once).")
@click.option("--address", default="0.0.0.0", show_default=True, help="Listen address with --port.")
@click.pass_obj
def metrics_cmd(obj: Context, port: int | None, address: str) -> int:
    """Prometheus metrics (utxoflow_…) of the chain, queues, pending messages, workers, pruner
    and recovery, read at each scrape. Workers serve their own processes' counters and
    histograms on UTXO_METRICS_PORT. Printed once, exit 2 when a source cannot be read."""
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from workers.monitor.exposition import SnapshotCollector

    last: dict[str, Any] = {}

    def take() -> dict[str, Any]:
        last["snap"] = _take(obj, 60)
        return last["snap"]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(take))
    if port is None:
        click.echo(generate_latest(registry).decode(), nl=False)
        failed = _failed(last["snap"])
        if failed:
            raise BadInput(failed)
        return 0
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as e:
        raise BadInput(f"cannot listen on {address}:{port}: {e.strerror or e}") from e
    from workers.cli.app import log

    log(f"metrics on http://{address}:{port}/metrics (Ctrl-C stops)")
    _stop_on_sigterm()
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


@cli.command("dead-letters")
@click.option("--drop", is_flag=True, help="Drop them (the count of all ever set aside stays).")
@click.pass_obj
def dead_letters_cmd(obj: Context, drop: bool) -> None:
    """The messages workers set aside rather than run (not JSON, not a task message a worker
    can take, too large), newest first: JSON lines {"at","reason","bytes","sha256","head",
    "headers"}. With --drop: {"dropped": N}."""
    import json

    import redis

    from workers.broker.kombu_fix import DEAD_LETTERS
    from workers.broker.redisurl import connect

    url = obj.broker_url()
    try:
        r = connect(url, timeout=10)
        if drop:
            pipe = r.pipeline()  # (MULTI: what is listed is what goes)
            pipe.llen(DEAD_LETTERS)
            pipe.delete(DEAD_LETTERS)
            emit({"dropped": int(pipe.execute()[0])})
            return
        for raw in r.lrange(DEAD_LETTERS, 0, -1):
            try:
                emit(json.loads(raw))
            except ValueError:  # (not a record of ours: shown as it is)
                text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                emit({"raw": text[:400]})
    except redis.RedisError as e:
        from workers.settings import mask_url

        raise BadInput(f"UTXO_BROKER_URL ({mask_url(url)}): {e}") from e
