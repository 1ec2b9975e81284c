"""Two-phase creation on Aerospike: the lock records and the record-level calls the coordinator
drives (`stores.utxo.twophase.PagedRecords`).

Invariants:
- A lock record is written create-only (key L ‖ txid), so of racing creators exactly one gets
  it. Whether it is live is its `expiresAt` (30 s + 2 s per record, at most 300 s); its record
  TTL is a day longer, so that a recovery can still read a dead creator's options; after that
  the server treats it as gone (and nsup, when the namespace runs it, removes it). A lapsed
  lock (or one whose holder is a dead process of this host) is removed under a generation
  check by the next acquirer, which then writes its own.
- Release removes only the caller's own lock (same holder and creation time), under a
  generation check, so a creator whose lock lapsed cannot release its successor's.
- Pages are create-only and mirror their master's record-level fields (`codec.MIRRORED`, and
  its `rid`), read from the master, which the coordinator writes first.
- The master's `creating` is cleared only after every child exists with its own flag clear
  (pages never go back to creating), so a clear master means a complete transaction.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from chain import hash_to_hex
from stores.errors import StorageError
from stores.lease import lapsed
from stores.utxo import slots, twophase, validate
from stores.utxo.aerospike import codec
from stores.utxo.aerospike.base import AerospikeBase
from stores.utxo.errors import TxNotFound
from stores.utxo.kernel.record import Record
from stores.utxo.values import LOCK_TYPE, CreationLock

LOCK_TXID = "lockTxid"
LOCK_RECORD_GRACE = 86_400  # seconds a lock record outlives its lock (for its options)
OPTIONS = "createOpts"


class PagedMixin(AerospikeBase):
    lock_base_ttl = 30.0
    lock_per_record_ttl = 2.0
    lock_max_ttl = 300.0

    def lock_ttl(self, records: int) -> float:
        """Seconds a creation lock for this many records lives."""
        return min(self.lock_base_ttl + self.lock_per_record_ttl * records, self.lock_max_ttl)

    def _lock_bins(self, txid: bytes) -> tuple[dict[str, Any], int] | None:
        """(the lock record's bins, its generation), or None."""
        from aerospike import exception as aex

        try:
            _k, meta, bins = self.conn.client.get(self.lock_key(txid))
        except aex.RecordNotFound:
            return None
        except aex.AerospikeError as e:
            raise self._fail("reading a creation lock", e) from e
        return bins, meta["gen"]

    def _remove_if(self, txid: bytes, gen: int) -> bool:
        import aerospike
        from aerospike import exception as aex

        try:
            self.conn.client.remove(
                self.lock_key(txid), policy={"gen": aerospike.POLICY_GEN_EQ, "generation": gen}
            )
        except (aex.RecordNotFound, aex.RecordGenerationError):
            return False
        except aex.AerospikeError as e:
            raise self._fail("removing a creation lock", e) from e
        return True

    def acquire_creation_lock(
        self, txid: bytes, expected_recs: int, options: dict[str, Any] | None = None
    ) -> CreationLock | None:
        """Take the lock for creating `txid`; None when someone else holds a live one."""
        validate.hash32("txid", txid)
        validate.number("expected_recs", expected_recs)
        now = int(time.time() * 1000)
        ttl = self.lock_ttl(expected_recs)
        lock = CreationLock(
            txid, now, now + int(ttl * 1000), os.getpid(), socket.gethostname(), expected_recs
        )
        bins = {
            "lockType": LOCK_TYPE, "createdAt": lock.created_at, "expiresAt": lock.expires_at,
            "pid": lock.process_id, "host": lock.hostname, "expected": expected_recs,
            "options": json.dumps(options or {}, separators=(",", ":")),
            LOCK_TXID: txid,  # the key is a digest: a query finds lapsed locks by this bin
        }  # fmt: skip
        record_ttl = int(ttl) + LOCK_RECORD_GRACE
        for _attempt in range(2):
            if self._create_only([(self.lock_key(txid), bins)], ttl=record_ttl)[0]:
                return lock
            held = self._lock_bins(txid)
            if held is None:
                continue  # released meanwhile: try again
            have, gen = held
            if not lapsed(f"{have['host']}:{have['pid']}", have["expiresAt"], now) or not self._remove_if(
                txid, gen
            ):
                return None
        return None

    def release_creation_lock(self, lock: CreationLock) -> bool:
        """Remove this holder's lock; False when it had lapsed and is gone or taken over."""
        held = self._lock_bins(lock.txid)
        if held is None:
            return False
        have, gen = held
        mine = (have["createdAt"], have["pid"], have["host"]) == (
            lock.created_at,
            lock.process_id,
            lock.hostname,
        )
        return mine and self._remove_if(lock.txid, gen)

    def creation_options(self, txid: bytes) -> dict[str, Any] | None:
        """The options of the last creator that locked `txid`, live or lapsed."""
        validate.hash32("txid", txid)
        held = self._lock_bins(txid)
        return None if held is None else dict(json.loads(held[0]["options"]))

    def half_done_creations(self, limit: int = 1000) -> list[bytes]:
        """Txids whose creation a dead creator left half done (see the Protocol): two scans of
        the set with filters (masters still creating; lock records), joined here."""
        from aerospike_helpers.expressions import base as exp

        validate.number("limit", limit)
        now = int(time.time() * 1000)
        creating = exp.And(exp.Eq(exp.IntBin("page"), 0), exp.Eq(exp.IntBin("creating"), 1)).compile()
        found = self._query("finding creating masters", ["txid"], expression=creating)
        masters = {bytes(b["txid"]) for b in found}
        is_lock = exp.Eq(exp.StrBin("lockType"), LOCK_TYPE).compile()
        live: set[bytes] = set()
        lapsed_locks: set[bytes] = set()
        for b in self._query("finding creation locks", [LOCK_TXID, "expiresAt"], expression=is_lock):
            if LOCK_TXID in b:  # a lock written before the bin existed is found by its master only
                (live if b["expiresAt"] > now else lapsed_locks).add(bytes(b[LOCK_TXID]))
        orphaned = lapsed_locks - masters
        if orphaned:
            ordered = sorted(orphaned)
            there = self._exists([self.key(t) for t in ordered])
            orphaned = {t for t, e in zip(ordered, there, strict=True) if not e}
        return sorted((masters - live) | orphaned)[:limit]

    def get_creation_lock(self, txid: bytes) -> CreationLock | None:
        """The live lock on `txid`, for inspection; an expired one counts as none."""
        validate.hash32("txid", txid)
        held = self._lock_bins(txid)
        if held is None or held[0]["expiresAt"] <= int(time.time() * 1000):
            return None
        b = held[0]
        return CreationLock(txid, b["createdAt"], b["expiresAt"], b["pid"], b["host"], b["expected"])

    # -- the record-level calls ------------------------------------------------------------------
    def create_master(
        self, rec: Record, creating: bool = True, options: dict[str, Any] | None = None
    ) -> bool:
        """Write an external master record, create-only; False when it exists already. A
        creating master keeps the creation's `options` beside it until its flag clears."""
        if not rec.id:
            rec.id = self._reserve_ids(1)[0]
        bins = codec.to_bins(rec)
        bins["creating"] = int(creating)
        if creating:
            bins[OPTIONS] = json.dumps(options or {}, separators=(",", ":"))
        return self._create_only([(self.key(rec.txid), bins)])[0]

    def create_page(self, page: Record) -> bool:
        """Write one child page with `creating` set, create-only; False when it exists."""
        validate.hash32("txid", page.txid)
        master = self._masters([page.txid]).get(page.txid, page)
        return self._create_only([(self.key(page.txid, page.page), codec.page_bins(page, master))])[0]

    def creation_state(self, txid: bytes) -> twophase.CreationState | None:
        validate.hash32("txid", txid)
        (bins,) = self._read_bins([self.key(txid)], ["creating", "totalExtraRecs", "utxos", OPTIONS])
        if bins is None:
            return None
        extra = int(bins.get("totalExtraRecs", 0))
        have = self._exists([self.key(txid, k) for k in range(1, extra + 1)])
        pages = frozenset([0, *(k for k, there in enumerate(have, 1) if there)])
        if bins.get(OPTIONS):
            frozen = bool(json.loads(bins[OPTIONS]).get("frozen", False))
        else:  # a creation without recorded options: its master's slots tell
            utxos = bytes(bins.get("utxos", b""))
            real = [
                utxos[k + 32 : k + slots.SLOT]
                for k in range(0, len(utxos), slots.SLOT)
                if not utxos.startswith(slots.NO_HASH, k)
            ]
            frozen = bool(real) and all(s == slots.FROZEN for s in real)
        return twophase.CreationState(
            creating=bins.get("creating") == 1, total_extra_recs=extra, pages=pages, frozen=frozen
        )

    def clear_creating_children(self, txid: bytes) -> int:
        (bins,) = self._read_bins([self.key(txid)], ["totalExtraRecs"])
        extra = 0 if bins is None else int(bins.get("totalExtraRecs", 0))
        keys = [self.key(txid, k) for k in range(1, extra + 1)]
        return sum(r == 1 for r in self._apply_all(keys, "clear_creating", []))

    def clear_creating_master(self, txid: bytes) -> bool:
        """Clear the master's flag once every child exists with its flag clear."""
        (bins,) = self._read_bins([self.key(txid)], ["creating", "totalExtraRecs"])
        if bins is None:
            raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
        if bins.get("creating") != 1:
            return True
        extra = int(bins.get("totalExtraRecs", 0))
        pages = self._read_bins([self.key(txid, k) for k in range(1, extra + 1)], ["creating"])
        n = sum(p is not None for p in pages)
        still = sum(p is not None and p.get("creating") == 1 for p in pages)
        twophase.check_pages_whole(txid, n, extra, still)
        res = self.rules.conn.apply(self.key(txid), "clear_creating", [])
        if isinstance(res, dict):
            raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
        held = self._lock_bins(txid)  # a dead creator's lapsed lock has nothing left to guard
        if held is not None and held[0]["expiresAt"] <= int(time.time() * 1000):
            self._remove_if(txid, held[1])
        return True

    def complete_creation(self, txid: bytes, block_height: int | None = None) -> bool:
        """Finish a half-done creation of `txid` (see `twophase.complete_creation`)."""
        validate.hash32("txid", txid)
        return twophase.complete_creation(self, txid, block_height)

    def _page_records(self, txid: bytes, extra: int) -> dict[int, Record]:
        """Every child page of a master with `extra` of them, by index."""
        found = self._read_bins([self.key(txid, k) for k in range(1, extra + 1)])
        missing = [k for k, b in enumerate(found, 1) if b is None]
        if missing:
            raise StorageError(f"tx {hash_to_hex(txid)}: child pages {missing[:5]} are missing")
        return {k: codec.from_bins(b) for k, b in enumerate(found, 1) if b is not None}
