"""What every part of the Aerospike UTXO store stands on: the connection and the ported rules,
records read in batches, create-only writes, calls of the Lua module on many records, and the
store's own values (height, schema, batch size) in one meta record.

Invariants:
- Everything lives in the URL's set (an Aerospike namespace holds at most 4,095 set names,
  for good): a master under its txid (32 bytes), child page k under txid ‖ k (u32 LE, 36
  bytes), two-phase creation's lock records under L ‖ txid (33 bytes), the meta record under
  META. Only records have a `page` bin: a query of the set filters by it.
- A record changes only through the Lua module (one call per record, atomic on the server) or
  a create-only write; nothing is read, changed in Python and written back.
- Every client failure is a `StorageError` naming the store's URL without its password.
- Record ids (`rid`, the script index's order) come from the meta record's counter `nextId`,
  moved on atomically by a whole batch's worth at once: they only grow, and a creation that
  starts after some ids were handed out draws higher ones (a PostgreSQL sequence's promise).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from stores.errors import StorageError
from stores.utxo import pagesize, validate
from stores.utxo.aerospike import codec
from stores.utxo.aerospike.client import BATCH as BATCH  # (re-exported: the batch size callers chunk by)
from stores.utxo.aerospike.client import Connection, Key, chunked
from stores.utxo.aerospike.rules import Rules
from stores.utxo.external import ExternalTxs
from stores.utxo.kernel.record import Record
from stores.utxo.prevouts import RecentOutputs

SCHEMA_VERSION = "utxoflow-aerospike-2"  # 2: records carry scriptKeys, liveKeys and rid
META = b"utxoflow-meta"  # the meta record's key (13 bytes)
LOCK_PREFIX = b"L"  # a lock record's key: L ‖ txid (33 bytes)
STORE_ID = "storeId"  # the meta record's bin: the store's id (`identity`)
NEXT_ID = "nextId"  # the meta record's bin: the last record id handed out


@contextmanager
def _nothing() -> Iterator[None]:
    yield


class AerospikeBase:
    """State and helpers every concern of the store shares (set up by `AerospikeUtxoStore`)."""

    conn: Connection
    rules: Rules
    url: str
    block_height: int
    retention: int
    batch_size: int
    max_tx_size_in_store: int
    externalize_all: bool
    external: ExternalTxs
    recent: RecentOutputs
    concurrent_writers = True  # every record is its own lock: writers proceed side by side

    @property
    def url_safe(self) -> str:
        return self.conn.url_safe

    def height_for(self, hint: int = 0) -> int:
        """The height a rule counts from: the caller's or the store's, whichever is higher."""
        return max(self.block_height, hint)

    def fused(self) -> AbstractContextManager[None]:
        """No transaction to fuse into: each record's change is atomic by itself."""
        return _nothing()

    def _fail(self, what: str, e: Exception) -> StorageError:
        return StorageError(f"{what} on {self.url_safe} failed: {getattr(e, 'msg', e)}")

    # -- keys ---------------------------------------------------------------------------------
    def key(self, txid: bytes | bytearray, page: int = 0) -> Key:
        return self.conn.key(txid, page)

    def lock_key(self, txid: bytes) -> Key:
        return (self.conn.namespace, self.conn.set, bytearray(LOCK_PREFIX + txid))

    def _meta_key(self) -> Key:
        return (self.conn.namespace, self.conn.set, bytearray(META))

    # -- reads --------------------------------------------------------------------------------
    def _read_bins(
        self, keys: Sequence[Key], bins: Sequence[str] | None = None
    ) -> list[dict[str, Any] | None]:
        """Each key's bins (only `bins`, if named), None for a missing record; in batches."""
        return self.conn.read_bins(keys, bins)

    def _masters(self, txids: Sequence[bytes], bins: Sequence[str] | None = None) -> dict[bytes, Record]:
        """The master records of `txids` that exist (without their pages)."""
        wanted = list(dict.fromkeys(txids))
        found = self._read_bins([self.key(t) for t in wanted], bins)
        return {t: codec.from_bins(b) for t, b in zip(wanted, found) if b is not None}

    def _exists(self, keys: Sequence[Key]) -> list[bool]:
        return [b is not None for b in self._read_bins(keys, ["page"])]

    # -- writes -------------------------------------------------------------------------------
    def _create_only(self, items: Sequence[tuple[Key, dict[str, Any]]], ttl: int | None = None) -> list[bool]:
        """Write each record unless its key exists: per item, whether it was written."""
        import aerospike
        from aerospike_helpers.batch import records as br

        policy: dict[str, Any] = {"exists": aerospike.POLICY_EXISTS_CREATE}
        if ttl is not None:
            policy["ttl"] = ttl
        write = aerospike.OPERATOR_WRITE

        def make(i: int) -> Any:
            key, bins = items[i]
            # (`operations.write`'s dict, made in place: a call per bin was a tenth of a create)
            return br.Write(key, [{"op": write, "bin": name, "val": value} for name, value in bins.items()],
                            policy=policy)

        # no retry by the client: a retried create-only write that had gone through would come
        # back "exists" and be taken for someone else's record (a busy key never ran: `batch`)
        # (keys are distinct: a create call's txids are, and a repeated one would only fail)
        done = self.conn.batch("writing records", make, len(items), {"max_retries": 0}, distinct=True)
        made: list[bool] = []
        for r in done:
            if r.result == 13:
                raise StorageError(
                    f"a record is too large for {self.url_safe} (max-record-size): lower "
                    "UTXO_BATCH_SIZE or UTXO_MAX_TX_SIZE_IN_STORE"
                )
            if r.result not in (0, 5):  # 5: the record exists
                raise StorageError(f"writing records on {self.url_safe} failed: result code {r.result}")
            made.append(r.result == 0)
        return made

    def _apply_each(self, calls: Sequence[tuple[Key, str, list[Any]]]) -> list[Any]:
        """Call the Lua module once per (key, function, args), in batches: each call's result
        (a missing record's is the function's own answer for it)."""
        return self.conn.apply_many(calls)

    def _apply_all(self, keys: Sequence[Key], fn: str, args: list[Any]) -> list[Any]:
        """The same call of the Lua module on many records."""
        return self.conn.apply_all(keys, fn, args)

    def _remove(self, keys: Sequence[Key]) -> int:
        """Delete these records; how many existed."""
        from aerospike import exception as aex

        n = 0
        try:
            for part in chunked(keys):
                res = self.conn.client.batch_remove(list(part))
                for r in res.batch_records:
                    if r.result not in (0, 2):
                        raise StorageError(
                            f"deleting records on {self.url_safe} failed: result code {r.result}"
                        )
                    n += r.result == 0
        except aex.AerospikeError as e:
            raise self._fail("deleting records", e) from e
        return n

    def _query(
        self, what: str, bins: Sequence[str], where: Any = None, expression: Any = None
    ) -> Iterator[dict[str, Any]]:
        """The bins of every record of the set that passes `where` (a secondary-index
        predicate) and `expression` (a compiled filter), in no particular order."""
        from aerospike import exception as aex

        q = self.conn.client.query(self.conn.namespace, self.conn.set)
        q.select(*bins)
        if where is not None:
            q.where(where)
        policy: dict[str, Any] = {"total_timeout": 0}
        if expression is not None:
            policy["expressions"] = expression
        try:
            found: list[dict[str, Any]] = []
            q.foreach(lambda rec: found.append(rec[2]), policy)
        except aex.AerospikeError as e:
            raise self._fail(what, e) from e
        yield from found

    # -- the store's own values -----------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        (bins,) = self._read_bins([self._meta_key()])
        return bins or {}

    def _set_meta(self, **values: Any) -> None:
        from aerospike import exception as aex

        try:
            self.conn.client.put(self._meta_key(), values)
        except aex.AerospikeError as e:
            raise self._fail("writing the store's meta record", e) from e

    def _reserve_ids(self, n: int) -> range:
        """`n` new record ids (see the invariants), in one round trip. A retried increment
        whose first try went through only leaves a gap: ids need not be dense."""
        from aerospike import exception as aex
        from aerospike_helpers.operations import operations as op

        if n <= 0:
            return range(0)
        try:
            ops = [op.increment(NEXT_ID, n), op.read(NEXT_ID)]
            _k, _m, bins = self.conn.client.operate(self._meta_key(), ops)
        except aex.AerospikeError as e:
            raise self._fail("drawing record ids", e) from e
        top = int(bins[NEXT_ID])
        return range(top - n + 1, top + 1)

    def identity(self) -> str:
        from aerospike import exception as aex
        from aerospike_helpers import expressions as exp

        found = self._meta().get(STORE_ID)
        if found is None:
            absent = {"expressions": exp.Not(exp.BinExists(STORE_ID)).compile()}
            try:  # create-only for the bin: a second worker's id is filtered out, not written
                self.conn.client.put(self._meta_key(), {STORE_ID: uuid.uuid4().hex}, policy=absent)
            except aex.FilteredOut:
                pass
            except aex.AerospikeError as e:
                raise self._fail("writing the store's id", e) from e
            found = self._meta()[STORE_ID]
        return str(found)

    def set_block_height(self, height: int) -> None:
        validate.height("block height", height, zero_ok=False)
        self._set_meta(height=height)
        self.block_height = height

    def current_height(self) -> int:
        """The store's height, read afresh (another process may have moved it on)."""
        self.block_height = max(self.block_height, int(self._meta().get("height", 0)))
        return self.block_height

    def _check_schema(self, may_create: bool) -> None:
        """Stamp a new store with SCHEMA_VERSION and its batch size; refuse one of another
        version; use the batch size it was created with (`stores.utxo.pagesize`)."""
        meta = self._meta()
        if not meta:
            if not may_create:
                raise StorageError(f"no UTXO store at {self.url_safe}")
            if self.batch_size > codec.MAX_BATCH_SIZE:  # (a new store only: an old one keeps its own)
                raise ValueError(
                    f"batch_size (UTXO_BATCH_SIZE) must be 1 to {codec.MAX_BATCH_SIZE} on Aerospike, "
                    f"got {self.batch_size}: a record holds that many 68-byte slots, every spend "
                    "rewrites it whole, and a record is capped at 1 MiB"
                )
            self._set_meta(schema=SCHEMA_VERSION, batchSize=self.batch_size)
            return
        if meta.get("schema") != SCHEMA_VERSION:
            raise StorageError(
                f"{self.url_safe} holds a UTXO store of schema {meta.get('schema') or 'unversioned'!r}; this "
                f"version needs {SCHEMA_VERSION!r} (point UTXO_STORE_URL at a new set)"
            )
        self.batch_size = pagesize.adopt(self.url_safe, int(meta.get("batchSize", self.batch_size)),
                                         self.batch_size)
        self.rules.batch_size = self.batch_size
        self.block_height = int(meta.get("height", 0))
