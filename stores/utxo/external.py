"""External transactions: raw bytes in the blob store, metadata and slots in the record (seed 003
"External Blob Storage").

A transaction is external when it is larger than UTXO_MAX_TX_SIZE_IN_STORE, spans more than one
record, or UTXO_EXTERNALIZE_ALL is set. Its blob is `<xx>/<txid>.tx`: the transaction in BIP-239
extended format when every input's previous output is known (so spends and validation need no
parent lookups), else in the standard format. A record that has no transaction (a snapshot
record) keeps its outputs as `<xx>/<txid>.outputs`:
    txid (32) ‖ height (u32 LE) ‖ coinbase (u8) ‖ VarInt(n) ‖ n × (VarInt(vout) ‖ u64 sats ‖
    VarInt(len) ‖ script)

Invariants:
- The blob is written (put-if-absent: one already there is the same transaction) before any
  record that names it, so a record never points at a missing blob.
- Reads that are repeated hit a bounded cache of raw blobs (least recently used goes first);
  a blob larger than a quarter of the budget is never cached, so one giant transaction cannot
  flush everything else.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence

from chain import Tx, hash_to_hex, parse_tx
from stores.blob.protocol import BlobNotFound, BlobStore, blob_key
from stores.utxo import slots
from stores.utxo.errors import ProcessingError, StorageError

_HEAD = struct.Struct("<32sIB")


def encode_outputs_blob(
    txid: bytes, height: int, coinbase: bool, outputs: Sequence[tuple[int, int, bytes]]
) -> bytes:
    return _HEAD.pack(txid, height, int(coinbase)) + slots.encode_outputs(outputs)


def decode_outputs_blob(blob: bytes) -> tuple[bytes, int, bool, dict[int, tuple[int, bytes]]]:
    """(txid, height, coinbase, vout → (satoshis, script)) of an `.outputs` blob."""
    if len(blob) < _HEAD.size + 1:
        raise ProcessingError(f"outputs blob of {len(blob)} bytes is truncated")
    txid, height, coinbase = _HEAD.unpack_from(blob)
    try:
        return txid, height, bool(coinbase), slots.decode_outputs(blob[_HEAD.size :])
    except (IndexError, struct.error) as e:
        raise ProcessingError(f"outputs blob of tx {hash_to_hex(txid)} is malformed: {e}") from e


class ExternalTxs:
    """The blob side of external records, with a bounded cache of what was read."""

    def __init__(self, blobs: BlobStore | None, cache_bytes: int = 64 << 20) -> None:
        self.blobs = blobs
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _store(self) -> BlobStore:
        if self.blobs is None:
            raise StorageError(
                "this transaction must be stored externally, but the UTXO store has no blob store "
                "(set UTXO_BLOB_URL)"
            )
        return self.blobs

    # -- writing ---------------------------------------------------------------------------------
    def put_tx(self, tx: Tx) -> str:
        """Write the transaction (extended when it carries every previous output); its key."""
        key = blob_key(tx.txid, "tx")
        data = tx.serialize(extended=True) if tx.is_extended else tx.raw
        self._store().put_if_absent(key, data)
        return key

    def put_outputs(
        self, txid: bytes, height: int, coinbase: bool, outputs: Sequence[tuple[int, int, bytes]]
    ) -> str:
        key = blob_key(txid, "outputs")
        self._store().put_if_absent(key, encode_outputs_blob(txid, height, coinbase, outputs))
        return key

    def delete(self, txid: bytes) -> None:
        """Remove both kinds (a missing blob is fine); any other failure raises StorageError."""
        for kind in ("tx", "outputs"):
            key = blob_key(txid, kind)
            self._store().delete(key)
            with self._lock:
                data = self._cache.pop(key, None)
                if data is not None:
                    self._cached -= len(data)

    # -- reading ---------------------------------------------------------------------------------
    def _read(self, key: str) -> bytes:
        with self._lock:
            data = self._cache.get(key)
            if data is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return data
        data = self._store().get(key)
        with self._lock:
            self.misses += 1
            if len(data) <= self.cache_bytes // 4 and key not in self._cache:
                self._cache[key] = data
                self._cached += len(data)
                while self._cached > self.cache_bytes:
                    _k, old = self._cache.popitem(last=False)
                    self._cached -= len(old)
        return data

    def get_tx(self, txid: bytes) -> Tx | None:
        """The whole transaction, or None when the blob keeps only outputs; BlobNotFound if
        neither exists."""
        try:
            raw = self._read(blob_key(txid, "tx"))
        except BlobNotFound:
            self._read(blob_key(txid, "outputs"))  # raises BlobNotFound when that is missing too
            return None
        tx = parse_tx(raw)
        if tx.txid != txid:
            raise StorageError(f"blob {blob_key(txid, 'tx')} holds tx {tx.txid_hex}, not {hash_to_hex(txid)}")
        return tx

    def outputs(self, txid: bytes) -> dict[int, tuple[int, bytes]]:
        """vout → (satoshis, script) of the outputs the blob keeps."""
        try:
            raw = self._read(blob_key(txid, "tx"))
        except BlobNotFound:
            return decode_outputs_blob(self._read(blob_key(txid, "outputs")))[3]
        return {v: (o.satoshis, o.script) for v, o in enumerate(parse_tx(raw).outputs)}

    def exists(self, txid: bytes) -> bool:
        store = self._store()
        return store.exists(blob_key(txid, "tx")) or store.exists(blob_key(txid, "outputs"))
