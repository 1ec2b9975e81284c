"""The recovery manager (the transaction-recovery service's design): one leader at a time scans for
what a dead worker, a lost message or a crash left behind, and has it finished.

Every UTXO_RECOVERY_SCAN_INTERVAL seconds a manager tries to lead (workers/recovery/leader.py);
while it leads, each scan
1. gives back the messages dead workers held (workers/recovery/liveness.py), and every
   UTXO_REQUEUE_INTERVAL sends again the pending messages a broker lost (workers/recovery/requeue.py);
2. sends one block message to take the chain up when it is not at rest and nobody holds its
   lease (a coordinator that died mid-block, its chunk-board claims lapsed with it), and sends
   again a block message lost on its way to a worker (`_lost_blocks`);
3. enters the half-done creations the UTXO store reports as `creation:<txid>` entries;
4. claims up to UTXO_RECOVERY_BATCH_SIZE entries older than UTXO_RECOVERY_TTL, leased for
   UTXO_RECOVERY_LEASE under a holder name unique to this claim, and hands them on: to at most
   UTXO_RECOVERY_WORKERS `utxoflow.recovery.handle` tasks (in workers), or handled here
   (`utxo recover`). Each entry is released with its outcome (workers/recovery/handlers.py).

Invariants:
- Nothing is claimed or re-sent by a manager that does not lead at the start of that scan.
- A claim that is never released (its task lost, its worker killed) returns to the pool when
  its lease expires; a stale task finds its holder name gone and its releases refused.
- A scan that fails part-way (a store or the broker away) is logged and the next one starts
  afresh: every step is safe to repeat.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

from stores.errors import StorageError
from stores.lease import holder_gone
from stores.state import StateStore
from stores.state.recovery import RecoveryEntry
from workers.broker.runs import BrokerRun, BrokerUnreachable
from workers.recovery.leader import Leadership
from workers.settings import Settings

log = logging.getLogger("utxoflow.recovery")
# what a scan counts (kind, outcome) in the state store's recovery_counts (`utxo recover`, metrics)
GIVEN_BACK, RESENT, TAKEN_UP = ("message", "given back"), ("message", "re-sent"), ("block", "chain taken up")
COUNTED = (GIVEN_BACK, RESENT, TAKEN_UP)
FAILED_SCANS = 3  # scans in a row that fail before a leader lets go (and waits a lease)
LOST_SEEN_S = 4.0  # a block message held by no one in two scans this far apart is lost (`_lost_blocks`)
LOST_SCAN = 500  # pending block messages looked at per scan

# (claimed, holder) → what became of each
Dispatch = Callable[[list[RecoveryEntry], str], list[dict[str, Any]]]
Send = Callable[[str, list[Any]], None]  # (task, args)


class RecoveryManager:
    def __init__(
        self,
        settings: Settings,
        state: StateStore,
        leadership: Leadership,
        dispatch: Dispatch,
        *,
        send: Send | None = None,
        requeue: Callable[[], dict[str, Any]] | None = None,
        restore: Callable[[], dict[str, Any]] | None = None,
        half_done: Callable[[int], list[bytes]] | None = None,
        held: Callable[[], set[str]] | None = None,
    ) -> None:
        self.s, self.state, self.leadership, self.dispatch = settings, state, leadership, dispatch
        self.send, self.requeue, self.restore, self.half_done = send, requeue, restore, half_done
        self.held = held  # the ids of the block messages a queue or a live worker holds
        self._last: dict[str, float] = {}  # step → when it last ran (the throttled ones)
        self._unheld: dict[str, float] = {}  # block message id → when first seen held by none
        self._scans = 0

    @property
    def instance(self) -> str:
        return self.leadership.instance

    def _due(self, step: str, every_s: float) -> bool:
        """Whether `step` may run now (at most once per `every_s`); if so, it is noted as run."""
        now = time.monotonic()
        if step in self._last and now - self._last[step] < every_s:
            return False
        self._last[step] = now
        return True

    def scan_once(self) -> dict[str, Any] | None:
        """One scan if this manager leads (None: another does): what it did."""
        if not self.leadership.hold():
            return None
        self._scans += 1
        report: dict[str, Any] = {"leader": self.instance, "led_at": round(time.time(), 3)}
        if self.restore is not None:
            report["messages"] = got = self._step("giving back dead workers' messages", self.restore)
            self._count(GIVEN_BACK, got.get("restored", 0))
        if self.requeue is not None and self._due("requeue", self.s.requeue_interval):
            report["requeue"] = got = self._step("re-sending lost messages", self.requeue)
            self._count(RESENT, got.get("resent", 0))
        report["chain"] = got = self._step("looking at the chain", self._chain)
        self._count(TAKEN_UP, int("resumed" in got))
        if self.held is not None and self.send is not None:
            report["lost_blocks"] = got = self._step("looking for lost block messages", self._lost_blocks)
            self._count(RESENT, len(got.get("resent", [])))
        # a scan of the UTXO store (on Aerospike, of the whole set): once a lease is enough, as a
        # creation is only found once its lock has lapsed anyway
        if self.half_done is not None and self._due("creations", self.s.recovery_lease):
            report["creations"] = self._step("finding half-done creations", self._creations)
        # the bytes of txs nobody will apply again (stores/state/txbytes.py): most go with their
        # entry's release; this takes the rest, once a lease (a scan of a mempool-sized table)
        if self._due("tx_bytes", self.s.recovery_lease):
            report["tx_bytes"] = self._step("dropping the bytes of finished txs", lambda: {
                "dropped": self.state.sweep_tx_bytes(), "reasons_dropped": self.state.sweep_waits()})
        holder = f"{self.instance}/{self._scans}:{uuid.uuid4().hex[:8]}"
        claimed = self.state.recovery_claim(
            holder, self.s.recovery_lease, self.s.recovery_ttl, self.s.recovery_batch_size
        )
        report["claimed"] = [e.ident for e in claimed]
        if claimed:
            report["handled"] = self.dispatch(claimed, holder)
        return report

    def _count(self, what: tuple[str, str], n: int) -> None:
        def count() -> dict[str, Any]:
            self.state.recovery_count(*what, n)
            return {}

        if n:
            self._step("counting outcomes", count)

    def _step(self, what: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return fn()
        except (StorageError, BrokerUnreachable, OSError) as e:
            log.warning("recovery: %s failed: %s", what, e)
            return {"failed": str(e)}
        except Exception as e:  # e.g. redis's errors: the next scan tries again
            log.warning("recovery: %s failed: %s: %s", what, type(e).__name__, e)
            return {"failed": f"{type(e).__name__}: {e}"}

    def _chain(self) -> dict[str, Any]:
        from workers.chainstate.chainlease import LEASE
        from workers.chainstate.sequencer import resume_message
        from workers.runtime.ingest import BLOCK_TASK

        holder = self.state.lease_holder(LEASE)
        if holder is not None and not holder_gone(holder):
            return {"applying": holder}
        args = resume_message(self.state)
        if args is None:
            return {"at_rest": True}
        # one message per lease: the worker that takes it holds the chain's lease at once
        if self.send is None or not self._due("resume", self.s.recovery_lease):
            return {"at_rest": False}
        self.send(BLOCK_TASK, args)
        log.warning("recovery: the chain is not at rest and nobody applies it: sent block %s", args[0])
        return {"at_rest": False, "resumed": args[0]}

    def _lost_blocks(self) -> dict[str, Any]:
        """Re-send the block messages lost on their way to a worker (popped from the queue by
        one that died before kombu noted it in `unacked`, or before the worker noted the
        delivery): pending for over a third of a lease, their block not in the index (a
        block's task indexes it first), and held by no queue and no live worker's noted
        delivery in two scans at least LOST_SEEN_S apart (a worker that just took one notes
        it within milliseconds). The chain's progress then waits seconds for them, not
        UTXO_REQUEUE_AFTER; a second delivery of one is harmless (the task is idempotent)."""
        from workers.runtime.ingest import BLOCK_TASK

        assert self.held is not None and self.send is not None
        now = time.time()
        old = self.state.pending(kind="block", sent_before=now - self.s.recovery_lease / 3, limit=LOST_SCAN)
        if not old:
            self._unheld = {}
            return {}
        # (indexed first: in a catch-up every pending block is, and the queues are not read)
        unindexed = [e for e in old if not self._indexed(e.key)]
        held = self.held() if unindexed else set()
        unheld = [e for e in unindexed if e.ident not in held]
        seen, self._unheld = self._unheld, {}
        resent = []
        for e in unheld:
            first = seen.get(e.ident, now)
            if now - first >= LOST_SEEN_S:
                self.send(BLOCK_TASK, [e.key, e.ident])
                resent.append(e.ident)
                first = now  # (seen afresh: not sent again before it could be taken)
            self._unheld[e.ident] = first
        if resent:
            log.warning("recovery: re-sent %d block message(s) no queue or worker held: %s",
                        len(resent), ", ".join(resent[:5]))
        return {"unheld": len(unheld), "resent": resent}

    def _indexed(self, key: str) -> bool:
        try:
            return self.state.get_block(bytes.fromhex(key)[::-1]) is not None
        except ValueError:  # not a block hash: only its task can tell
            return True

    def _creations(self) -> dict[str, Any]:
        assert self.half_done is not None
        found = self.half_done(self.s.recovery_batch_size)
        added = self.state.recovery_add("creation", [t[::-1].hex() for t in found]) if found else 0
        return {"found": len(found), "added": added}

    def run(
        self,
        stop: threading.Event,
        on_scan: Callable[[dict[str, Any]], None] | None = None,
        around: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        """Scan every interval until `stop` is set, then let go of the leadership; each scan
        (and the letting go) inside `around()`."""
        tick = min(self.s.recovery_scan_interval, self.s.requeue_interval)
        failed = 0
        try:
            while not stop.is_set():
                try:
                    with around():
                        report = self.scan_once()
                    failed = 0
                except Exception as e:  # the leadership, a claim or its hand-off failed
                    log.warning("recovery scan failed: %s: %s", type(e).__name__, e)
                    report = None
                    failed += 1
                if report is not None and on_scan is not None:
                    on_scan(report)
                if failed >= FAILED_SCANS:  # a manager that cannot work lets another lead
                    log.warning("recovery manager %s lets go after %d failed scans", self.instance, failed)
                    with around():
                        self._let_go()
                    failed = 0
                    stop.wait(self.s.recovery_lease)
                stop.wait(tick)
        finally:
            with around():
                self._let_go()

    def _let_go(self) -> None:
        try:
            self.leadership.release()
        except Exception as e:  # a lock dies with its connection, a lease with its time
            log.warning("recovery manager %s could not let go: %s", self.instance, e)


def broker_requeue(state: StateStore, broker: BrokerRun, after_s: float) -> Callable[[], dict[str, Any]]:
    """The re-sending scan of workers/recovery/requeue.py, as a manager's step."""
    from workers.recovery.requeue import requeue
    from workers.runtime.ingest import publish_known, publish_txs

    def step() -> dict[str, Any]:
        send = partial(publish_known, state)
        return requeue(state, broker.current(fresh=True), after_s, send, publish_txs=publish_txs).to_json()

    return step
