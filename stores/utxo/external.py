"""External transactions: raw bytes in the blob store, metadata and slots in the record (Teranode's
UTXO data model "External Blob Storage").

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
from collections.abc import Collection, Iterator, Sequence

from chain import Tx, hash_to_hex, parse_tx
from chain.tx import iter_outputs, serialize
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


def extended_bytes(tx: Tx) -> bytes:
    """`tx.serialize(extended=True)`, in bounded memory. The outputs and locktime are the same
    bytes in both formats, so they are taken from `tx.raw` (the standard serialization) as
    they are; only the head (version, marker, inputs with their previous outputs) is built.
    Serializing the outputs again would join three parts per output: for a million outputs
    bytes.join's buffer table alone is 240 MB (an 80-byte Py_buffer per part)."""
    std_head = serialize(tx.version, tx.inputs, [], tx.locktime)  # ‖ varint(0) ‖ locktime
    ext_head = serialize(tx.version, tx.inputs, [], tx.locktime, extended=True)
    return b"".join((memoryview(ext_head)[:-5], memoryview(tx.raw)[len(std_head) - 5 :]))


class ExternalTxs:
    """The blob side of external records, with a bounded cache of what was read."""

    def __init__(self, blobs: BlobStore | None, cache_bytes: int = 64 << 20, url: str | None = None) -> None:
        """`blobs`, or the blob store at `url` opened on first use (so that a reader that never
        meets an external transaction never touches the blob store)."""
        self._blobs = blobs
        self.url = url if blobs is None else blobs.url
        self.owned = blobs is None and url is not None
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def configured(self) -> bool:
        return self.url is not None

    @property
    def blobs(self) -> BlobStore:
        return self._store()

    def _store(self) -> BlobStore:
        if self._blobs is None:
            if self.url is None:
                raise StorageError(
                    "the UTXO store has no blob store, which external transactions need (set UTXO_BLOB_URL)"
                )
            from stores.blob.factory import open_blob_store

            self._blobs = open_blob_store(self.url)
        return self._blobs

    def close(self) -> None:
        """Close the blob store if this object opened it."""
        if self.owned and self._blobs is not None:
            self._blobs.close()
            self._blobs = None

    # -- writing ---------------------------------------------------------------------------------
    def put_tx(self, tx: Tx) -> str:
        """Write the transaction (extended when it carries every previous output); its key."""
        key = blob_key(tx.txid, "tx")
        data = extended_bytes(tx) if tx.is_extended else tx.raw
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

    def outputs(self, txid: bytes, vouts: Collection[int]) -> dict[int, tuple[int, bytes]]:
        """vout → (satoshis, script) of those of `vouts` the blob keeps; only they are built."""
        want = set(vouts)
        top = max(want, default=-1)
        out: dict[int, tuple[int, bytes]] = {}
        for v, sats, script in self.walk(txid):
            if v in want:
                out[v] = (sats, script)
            if v >= top:
                break
        return out

    def walk(self, txid: bytes) -> Iterator[tuple[int, int, bytes]]:
        """(vout, satoshis, script) of every output the blob keeps, in vout order, built one at a
        time; BlobNotFound when there is no blob."""
        try:
            raw = self._read(blob_key(txid, "tx"))
        except BlobNotFound:
            kept = decode_outputs_blob(self._read(blob_key(txid, "outputs")))[3]
            yield from ((v, s, sc) for v, (s, sc) in sorted(kept.items()))
            return
        yield from iter_outputs(raw)

    def exists(self, txid: bytes) -> bool:
        store = self._store()
        return store.exists(blob_key(txid, "tx")) or store.exists(blob_key(txid, "outputs"))
