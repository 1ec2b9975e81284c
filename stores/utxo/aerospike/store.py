"""The Aerospike UTXO store (`aerospike://HOST:PORT[,…]/NAMESPACE?set=SET`): every concern of
the Protocol in its own module, layered (each may use those below it):

    scriptindex.py  the script index: a script's unspent outputs, a page at a time
    read.py      records, outputs, GetSpend, the UTXO views
    prune.py     delete-at-height queries and pruning, expired preservations, old unmined
    marks.py     block membership, longest chain, locked, conflicting, preservation
    spend.py     spends, unspends, freeze / unfreeze / reassign
    create.py    creating records (one-record, external, multi-record), snapshot imports
    paged.py     two-phase creation's lock records and the record-level calls it drives
    base.py      batches of reads, create-only writes and Lua calls; the meta record
    rules.py     the kernel's rules as calls of the Lua module (`utxoflow.lua`), per record
    codec.py     the one mapping between bins and `Record`s
    client.py    the URL, the client, the module's registration

The store's own invariants are base.py's; each module states its own.
"""

from __future__ import annotations

import time
from typing import Any

from stores.blob.protocol import BlobStore
from stores.errors import StorageError
from stores.utxo.aerospike import codec
from stores.utxo.aerospike.client import Connection
from stores.utxo.aerospike.marks import StateMixin
from stores.utxo.aerospike.prune import PruneMixin
from stores.utxo.aerospike.rules import Rules
from stores.utxo.aerospike.scriptindex import LIVE_KEYS_INDEX, ScriptsMixin, create_index
from stores.utxo.aerospike.spend import SpendMixin
from stores.utxo.external import ExternalTxs
from stores.utxo.prevouts import RecentOutputs

DAH_INDEX = "utxoflow_dah"  # (per namespace: its records in every set)
INDEX_WAIT = 600.0  # seconds an index another process is building is waited for


class AerospikeUtxoStore(ScriptsMixin, PruneMixin, StateMixin, SpendMixin):
    """Implements `stores.utxo.protocol.UtxoStore` on an Aerospike namespace and set."""

    def __init__(
        self,
        url: str,
        *,
        retention: int = 288,
        batch_size: int = codec.DEFAULT_BATCH_SIZE,
        lock_base_ttl: float = 30.0,
        lock_per_record_ttl: float = 2.0,
        lock_max_ttl: float = 300.0,
        create: bool = True,
        blob_url: str | None = None,
        blobs: BlobStore | None = None,
        max_tx_size_in_store: int = 1 << 20,
        externalize_all: bool = False,
        external_cache_bytes: int = 64 << 20,
    ) -> None:
        """As `stores.utxo.sql.store.SqlUtxoStore`: `create=False` opens an existing store only;
        `batch_size` is fixed when the store is created (its default and cap are Aerospike's
        own: `codec.DEFAULT_BATCH_SIZE`; an existing store keeps its own whatever is asked:
        `_check_schema`); `retention` 0 means never prune."""
        if batch_size <= 0:
            raise ValueError(f"batch_size (UTXO_BATCH_SIZE) must be 1 or more, got {batch_size}")
        if retention < 0:
            raise ValueError(f"retention must be 0 (never prune) or more, got {retention}")
        self.url = url
        self.fuses = False  # each record's change is atomic by itself: nothing to fuse into
        self.retention = retention
        self.batch_size = batch_size
        self.max_tx_size_in_store = max_tx_size_in_store
        self.externalize_all = externalize_all
        self.lock_base_ttl = lock_base_ttl
        self.lock_per_record_ttl = lock_per_record_ttl
        self.lock_max_ttl = lock_max_ttl
        self.may_create = create
        self.block_height = 0
        self.recent = RecentOutputs()
        self.conn = Connection(url)
        try:
            self.rules = Rules(self.conn, batch_size, retention)
            self._check_schema(create)
            self._ensure_index()
        except BaseException:
            self.conn.close()
            raise
        self.external = ExternalTxs(blobs, external_cache_bytes, blob_url)

    def _ensure_index(self) -> None:
        """The namespace's secondary indexes, each made once for every set (a query of one set
        uses it): the pruner's on deleteAtHeight, the script index's on liveKeys' map keys
        (`scripts`). Creating one blocks until it is built; one that another process is still
        building is waited for here (state WO in `sindex-list` until it is readable)."""
        import aerospike
        from aerospike import exception as aex

        client = self.conn.client
        no_set: Any = None  # (the client's stubs say str; None is every set)
        wanted = {
            DAH_INDEX: lambda: client.index_single_value_create(
                self.conn.namespace, no_set, "deleteAtHeight", aerospike.INDEX_NUMERIC, DAH_INDEX
            ),
            LIVE_KEYS_INDEX: lambda: create_index(client, self.conn.namespace),
        }
        deadline = time.monotonic() + INDEX_WAIT
        try:
            while True:
                states = self._index_states()
                missing = [n for n in wanted if n not in states]
                for name in missing:
                    try:
                        wanted[name]()
                    except aex.IndexFoundError:  # made meanwhile by another process: listed next time
                        pass
                building = missing or [n for n in wanted if states[n] != "RW"]
                if not building:
                    return
                if time.monotonic() > deadline:
                    raise StorageError(f"the index {building[0]} on {self.url_safe} is not ready")
                if not missing:
                    time.sleep(0.2)
        except aex.AerospikeError as e:
            raise self._fail("creating the store's indexes", e) from e

    def _index_states(self) -> dict[str, str]:
        """Each secondary index of the namespace by name: its worst state over the nodes (RW:
        readable; WO while it is being built)."""
        out: dict[str, str] = {}
        for _node, (_err, text) in self.conn.client.info_all(f"sindex-list:ns={self.conn.namespace}").items():
            for entry in str(text or "").strip().split(";"):
                fields = dict(f.split("=", 1) for f in entry.split(":") if "=" in f)
                name = fields.get("indexname")
                if name:
                    state = fields.get("state", "RW")
                    out[name] = state if out.get(name, "RW") == "RW" else out[name]
        return out

    def close(self) -> None:
        self.conn.close()
        self.external.close()
