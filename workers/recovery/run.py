"""Building a recovery manager for a process: inside a worker (its main process: claims go out
as `utxoflow.recovery.handle` tasks) or in `utxo recover` (claims handled in the process).

Invariants:
- A manager uses its own state store and UTXO store, in the thread that runs it — never a pool
  child's connections.
- Inside a worker, no connection of the manager is open while the main process forks a pool
  child (a replacement for one that died): SQLite's per-process lock bookkeeping would go to
  the child with it, and the child's own connection to the file would then wait forever for a
  lock nobody holds. So the manager opens its stores for a scan and closes them after it, and
  a fork waits for a scan under way to end (`os.register_at_fork`, `_SCANNING`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from stores.lease import holder_id
from stores.state import StateStore, open_state_store
from stores.state.recovery import RecoveryEntry
from workers.broker.runs import BrokerRun, is_redis
from workers.recovery.leader import leadership
from workers.recovery.liveness import Heartbeat, client, held_block_messages, kombu_restore, restore_dead
from workers.recovery.manager import Dispatch, RecoveryManager, broker_requeue
from workers.settings import Settings

log = logging.getLogger("utxoflow.recovery")
HANDLE_TASK = "utxoflow.recovery.handle"


def instance_name(settings: Settings) -> str:
    return settings.recovery_instance_id or holder_id("recovery")


def build(settings: Settings, state: StateStore, dispatch: Dispatch, app: Any) -> RecoveryManager:
    """A manager on `state`, sending through `app` (Celery), handing claims to `dispatch`."""
    lead = leadership(
        state, settings.recovery_advisory_lock_id, instance_name(settings), settings.recovery_lease
    )

    def half_done(limit: int) -> list[bytes]:
        from stores.utxo import open_utxo_store

        utxo = open_utxo_store(settings.store_url, create=False, **settings.store_options())
        try:  # (once a lease: opened for it alone, see the module)
            found: list[bytes] = utxo.half_done_creations(limit)
        finally:
            utxo.close()
        return found

    def send(task: str, args: list[Any]) -> None:
        from workers.runtime.ingest import BLOCK_TASK, publish_known

        if task == BLOCK_TASK:  # (short id, height and hash in Flower, as every block message)
            publish_known(state, task, *args)
        else:
            app.send_task(task, args=args)

    restore = held = None
    if is_redis(settings.broker_url):
        redis_client = client(settings.broker_url)

        def held() -> set[str]:
            return held_block_messages(redis_client)

        put_back = kombu_restore(app)

        def restore() -> dict[str, Any]:
            return restore_dead(redis_client, put_back)

    return RecoveryManager(
        settings, state, lead, dispatch, send=send,
        requeue=broker_requeue(state, BrokerRun(settings.broker_url), settings.requeue_after),
        restore=restore, half_done=half_done, held=held,
    )


def task_dispatch(app: Any, settings: Settings) -> Dispatch:
    """Claims out to at most UTXO_RECOVERY_WORKERS tasks on the `recovery` queue; each message
    expires with the lease (after it, the entries are claimed again anyway)."""

    def dispatch(entries: list[RecoveryEntry], holder: str) -> list[dict[str, Any]]:
        n = min(settings.recovery_workers, len(entries))
        groups = [[e.ident for e in entries[i::n]] for i in range(n)]
        for g in groups:
            app.send_task(HANDLE_TASK, args=[g, holder], expires=settings.recovery_lease)
        return [{"task": HANDLE_TASK, "entries": len(g)} for g in groups]

    return dispatch


class WorkerThreads:
    """A worker's threads: its liveness heartbeat (every worker on Redis), and — for a worker of
    the `recovery` queue — a manager contending for the leadership."""

    def __init__(self, app: Any, settings: Settings, node: str, manage: bool) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.taken: Callable[[str], None] = lambda _tag: None  # no `unacked` hash: nothing to note
        if manage:
            self._start(_manage, (app, settings, self._stop), "utxoflow-recovery")
        if is_redis(settings.broker_url):
            beat = Heartbeat(settings.broker_url, node, settings.recovery_lease)
            self._start(beat.run, (self._stop,), "utxoflow-alive")
            self.taken = beat.taken

    def _start(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout_s: float = 5.0) -> None:
        """The worker shuts down: the manager lets go of the leadership (so another leads at
        once, not a lease later), the heartbeat stops."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)


_SCANNING = threading.Lock()  # held by a worker's manager for a scan; a fork waits for it
_HOOKED: list[bool] = []  # the fork hook is registered once per process (a second would wait on itself)


class ScanState:
    """The manager's state store in a worker: opened at its first use in a scan, closed at the
    scan's end (`closed`), so that no connection is open between scans (see the module)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._store: StateStore | None = None

    def __getattr__(self, name: str) -> Any:
        if self._store is None:
            self._store = open_state_store(self.url, create=False)
        return getattr(self._store, name)

    @contextmanager
    def scan(self) -> Iterator[None]:
        with _SCANNING:
            try:
                yield
            finally:
                if self._store is not None:
                    store, self._store = self._store, None
                    store.close()


def _manage(app: Any, settings: Settings, stop: threading.Event) -> None:
    if not _HOOKED:
        _HOOKED.append(True)
        os.register_at_fork(
            before=_SCANNING.acquire, after_in_parent=_SCANNING.release, after_in_child=_SCANNING.release
        )
    state = ScanState(settings.state_url)
    manager = build(settings, state, task_dispatch(app, settings), app)  # type: ignore[arg-type]
    manager.run(stop, around=state.scan)
