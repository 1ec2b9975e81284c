"""One delivery of a mempool transaction at a time on Aerospike (`UtxoStore.delivering`).

A transaction's spend here is one call per parent record, each atomic by itself. A process that
dies between those calls, or between a refused call and the take-back of its new spends, leaves
spends that name a transaction with no record. A later delivery of it finds them its own, not
new, and could not tell them from a delivery running beside it — a slot names the spender, not
the attempt. Under this lease it can: it is the only delivery of the transaction under way, so
when its spend is refused and the transaction has no record, every slot that still holds the
transaction's spends is a dead attempt's, and goes back (`rules.Rules.spend_tx`'s `clear`).

Invariants:
- The lease is the record `D ‖ txid`, written create-only with an expiry (and a record TTL a
  little longer); its holder is `host:pid:token` (`stores.lease`). It is taken over when it has
  lapsed: past its expiry, or its holder a process of this host that no longer runs.
- Every mempool delivery (`workers.mempool.apply_tx`, the recovery manager's too) spends and
  creates inside it. A block does not take it: it creates its transactions before it spends
  for them, so a record that appears after a refused delivery looked is followed by the
  block's own spends, and one that appeared before is seen, and what was taken back is put
  back (`rules.Rules._put_back_if_made`).
- A transaction whose inputs are all in one record needs no lease: its spend is one call, whole
  or nothing, and leaves nothing half done.
- Released only by its holder (the record's generation checked): a lease that lapsed and was
  taken over is the taker's.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

from chain import Tx, hash_to_hex
from stores.errors import StorageError
from stores.lease import holder_id, lapsed
from stores.utxo.aerospike.client import Key
from stores.utxo.aerospike.create import CreateMixin

PREFIX = b"D"  # a delivery lease's key: D ‖ txid (33 bytes)
LEASE_S = 120  # far longer than a spend and a create, however many records the create writes
GRACE_S = 60  # the record outlives its expiry by this much (a lapsed lease is still read)


class DeliveryMixin(CreateMixin):
    _deliveries: dict[bytes, str]  # txid -> this process's holder name, while it delivers

    def _lease_key(self, txid: bytes) -> Key:
        return (self.conn.namespace, self.conn.set, bytearray(PREFIX + txid))

    @contextmanager
    def delivering(self, tx: Tx) -> Iterator[None]:
        if tx.is_coinbase or len({(i.prev_txid, i.prev_vout // self.batch_size) for i in tx.inputs}) < 2:
            yield  # one record: nothing can be left half done
            return
        holder = self._take_lease(tx.txid)
        self._deliveries[tx.txid] = holder
        try:
            yield
        finally:
            del self._deliveries[tx.txid]
            self._drop_lease(tx.txid, holder)

    def _clearable(self, txids: list[bytes]) -> Collection[bytes]:
        """Those of `txids` this process delivers (under the lease) that have no record."""
        mine = [t for t in txids if t in self._deliveries]
        if not mine:
            return set()
        return {t for t, there in zip(mine, self._exists([self.key(t) for t in mine])) if not there}

    def _take_lease(self, txid: bytes) -> str:
        holder = holder_id()
        for _attempt in range(2):
            now = int(time.time() * 1000)
            bins = {"holder": holder, "expiresAt": now + LEASE_S * 1000}
            if self._create_only([(self._lease_key(txid), bins)], ttl=LEASE_S + GRACE_S)[0]:
                return holder
            held = self._lease_bins(txid)
            if held is None:
                continue  # released meanwhile
            have, gen = held
            if not lapsed(have["holder"], have["expiresAt"], now):
                raise StorageError(f"tx {hash_to_hex(txid)} is being applied by {have['holder']}: "
                                   "try again later")  # fmt: skip
            self._remove_lease(txid, gen)  # (lost to another taker: the next attempt says so)
        raise StorageError(f"tx {hash_to_hex(txid)} is being applied by another worker: try again later")

    def _drop_lease(self, txid: bytes, holder: str) -> None:
        held = self._lease_bins(txid)
        if held is not None and held[0]["holder"] == holder:
            self._remove_lease(txid, held[1])

    def _lease_bins(self, txid: bytes) -> tuple[dict[str, Any], int] | None:
        from aerospike import exception as aex

        try:
            _k, meta, bins = self.conn.client.get(self._lease_key(txid))
        except aex.RecordNotFound:
            return None
        except aex.AerospikeError as e:
            raise self._fail("reading a delivery lease", e) from e
        return bins, meta["gen"]

    def _remove_lease(self, txid: bytes, gen: int) -> bool:
        import aerospike
        from aerospike import exception as aex

        try:
            self.conn.client.remove(
                self._lease_key(txid), policy={"gen": aerospike.POLICY_GEN_EQ, "generation": gen}
            )
        except (aex.RecordNotFound, aex.RecordGenerationError):
            return False
        except aex.AerospikeError as e:
            raise self._fail("removing a delivery lease", e) from e
        return True
