"""`utxo recover`: the recovery manager's state (leader, entries per state, outcomes, the last
ones), one scan of it (`--once`), or a manager run in the foreground (`--run`). Workers of the
`recovery` queue run managers too; only the one that leads scans (workers/recovery/)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import click

from stores.state import StateStore, open_state_store
from stores.state.recovery import RecoveryEntry
from workers.cli.app import BadInput, Context, NotFound, cli, emit, log


@cli.command("recover")
@click.option("--once", is_flag=True, help="Run one scan as the leader and print what it claimed and "
              "what became of each.")
@click.option("--run", "run_", is_flag=True, help="Run a manager until stopped (SIGTERM/SIGINT), "
              "contending for the leadership; one JSON line per scan it leads.")
@click.option("--wait", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds --once waits for the leadership while another manager leads.")
@click.option("--last", type=click.IntRange(min=0, max=1000), default=20, show_default=True,
              help="How many of the last outcomes the status lists.")
@click.pass_obj
def recover_cmd(obj: Context, once: bool, run_: bool, wait: float, last: int) -> int:
    """Print the recovery manager's state (JSON): the leader, entries per kind and state,
    outcomes counted per kind, and the last outcomes. Exit 1 from --once when another manager
    leads for all of --wait."""
    if once and run_:
        raise BadInput("--once and --run: choose one")
    if once or run_:
        obj.broker_url()  # (a scan restores and re-sends messages)
    state = open_state_store(obj.settings.state_url, create=False)
    try:
        if not (once or run_):
            emit(status(state, last))
            return 0
        manager = _manager(obj, state)
        if run_:
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            log(f"recovery manager {manager.instance}: contending for the leadership")
            manager.run(stop, on_scan=emit)
            return 0
        deadline = time.monotonic() + wait
        while (report := manager.scan_once()) is None:
            if time.monotonic() >= deadline:
                from workers.recovery.leader import shown_leader

                other = shown_leader(state)
                raise NotFound(f"another recovery manager leads ({(other or {}).get('instance', 'unknown')})")
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        manager.leadership.release()
        emit(report)
        return 0
    finally:
        state.close()


def status(state: StateStore, last: int) -> dict[str, Any]:
    from workers.recovery.leader import shown_leader

    return {"leader": shown_leader(state), **state.recovery_summary(last)}


def _manager(obj: Context, state: StateStore) -> Any:
    from workers.recovery.handlers import release_all
    from workers.recovery.run import build
    from workers.runtime.app import app
    from workers.runtime.services import services

    def inline(entries: list[RecoveryEntry], _holder: str) -> list[dict[str, Any]]:
        return release_all(services(), entries)

    return build(obj.settings, state, inline, app)
