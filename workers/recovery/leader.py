"""Who runs the recovery manager: one leader at a time (the transaction-recovery service's design).

On a PostgreSQL state store the leader holds `pg_try_advisory_lock(UTXO_RECOVERY_ADVISORY_LOCK_ID)`
on a connection of its own: the lock dies with that connection, so a leader that dies (or loses
its database) stops leading at once, and the next manager to try takes over. On SQLite it holds
the state store's lease `recovery-leader` for UTXO_RECOVERY_LEASE seconds, renewed at every
scan: a dead leader's lease lapses within one lease (at once when it was a process of this host).

Invariants:
- At most one manager leads at a time (the lock or the lease decides; nothing else does).
- Every `hold()` re-checks: a leader that lost its lock or lease learns it there, before it
  claims anything. Claims are leased anyway, so even two leaders for a moment could not both
  hold one entry.
- The leader's name and the time its leadership runs to are written in the state store's meta
  (`recovery_leader`) for `utxo recover` to show; that record only informs, it never decides.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Protocol

from stores.errors import StorageError
from stores.lease import holder_id
from stores.state import StateStore
from stores.state.sessionlock import AdvisoryLock

log = logging.getLogger("utxoflow.recovery")
LEASE = "recovery-leader"
SHOWN = "recovery_leader"  # meta key: {"instance", "until"} of the leader, for display


class Leadership(Protocol):
    instance: str

    def hold(self) -> bool:
        """Take or keep the leadership; False while another manager leads."""

    def release(self) -> None:
        """Let go (a manager stopping), so that another leads at once."""


def shown_leader(state: StateStore) -> dict[str, Any] | None:
    """The leader as last written (None: none, or its leadership ran out)."""
    raw = state.get_meta(SHOWN)
    if raw is None:
        return None
    shown: dict[str, Any] = json.loads(raw)
    return shown if shown.get("until", 0) > time.time() else None


def _show(state: StateStore, instance: str, lease_s: float) -> None:
    state.set_meta(SHOWN, json.dumps({"instance": instance, "until": round(time.time() + lease_s, 3)}))


class LeaseLeadership:
    """The state store's lease (any backend; the one SQLite has)."""

    def __init__(self, state: StateStore, instance: str, lease_s: float) -> None:
        self.state, self.instance, self.lease_s = state, instance, lease_s
        # the lease's holder is this process's own (`host:pid:token`), whatever the instance is
        # called: two managers given one UTXO_RECOVERY_INSTANCE_ID are still two holders, and
        # a dead one on this host is taken over at once
        self.holder = holder_id("recovery")
        self._leading = False

    def hold(self) -> bool:
        got = self.state.acquire_lease(LEASE, self.holder, self.lease_s)
        if got != self._leading:
            log.warning("recovery manager %s %s", self.instance, "leads" if got else "no longer leads")
        self._leading = got
        if got:
            _show(self.state, self.instance, self.lease_s)
        return got

    def release(self) -> None:
        if self._leading:
            self.state.release_lease(LEASE, self.holder)
            self.state.set_meta(SHOWN, None)
            self._leading = False


class AdvisoryLeadership:
    """A lock held while a session of the manager's own lives (the state store's
    `session_lock`: PostgreSQL's advisory lock)."""

    def __init__(self, state: StateStore, lock: AdvisoryLock, instance: str, lease_s: float) -> None:
        self.state, self.lock = state, lock
        self.instance, self.lease_s = instance, lease_s
        self._leading = False

    def hold(self) -> bool:
        try:
            got = self.lock.hold()
        except StorageError as e:
            if self._leading:
                log.warning("recovery manager %s no longer leads: %s", self.instance, e)
            self._leading = False
            return False
        if got and not self._leading:
            log.warning("recovery manager %s leads", self.instance)
        self._leading = got
        if got:
            _show(self.state, self.instance, self.lease_s)
        return got

    def release(self) -> None:
        if self._leading:
            self.state.set_meta(SHOWN, None)
        self.lock.release()  # closing the session releases the lock
        self._leading = False


def leadership(state: StateStore, lock_id: int, instance: str, lease_s: float) -> Leadership:
    """The leadership fit for this state store (a session lock where it has one; else a lease)."""
    lock = state.session_lock(lock_id)
    if lock is not None:
        return AdvisoryLeadership(state, lock, instance, lease_s)
    return LeaseLeadership(state, instance, lease_s)
