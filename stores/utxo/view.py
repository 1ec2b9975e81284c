"""The UTXO listing (`iter_utxos`) written once for every backend: a backend supplies its
records as segments (a master, then each of its child pages) and says which spenders do not
confirm a spend; this walks them in bounded chunks and yields the live outputs.

Invariants:
- A chunk is at most VIEW_CHUNK segments or VIEW_BYTES of slots, so a record of a million
  outputs goes by a page or so at a time, and memory stays bounded whatever the store holds.
- A slot is live when it has a hash and either no spending data, frozen (frozen is not spent),
  or — in the confirmed view — a spender that does not confirm the spend: one the store holds
  not mined on the best chain, or one it does not hold (a mempool transaction whose spend is
  recorded and whose record is not written yet, or never will be: its worker died) — unless its
  parent lists it among its pruned children (`deleted_children`: only records mined on the best
  chain are pruned). The mined spenders are asked once per chunk (`_confirming`).
- An external transaction's outputs are read from its blob once, in vout order, while its
  pages go by (`OutputCursor`); one pruned while the listing runs lists nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from chain import Tx, hash_to_hex
from chain.tx import tx_outputs
from stores.blob.protocol import BlobNotFound
from stores.errors import StorageError
from stores.utxo import slots
from stores.utxo.external import ExternalTxs
from stores.utxo.kernel.record import Record
from stores.utxo.sql import codec
from stores.utxo.values import Utxo, UtxoStats

VIEW_CHUNK = 1000
VIEW_BYTES = 4 << 20
SLOT = slots.SLOT
NO_HASH, UNSPENT, FROZEN = slots.NO_HASH, slots.UNSPENT, slots.FROZEN
Segment = tuple[Record, bytes | None, int, int, bytes]  # (record, raw, raw_format, first vout, slots)
Outputs = dict[int, tuple[int, bytes]]  # vout → (satoshis, script)


class OutputCursor:
    """Outputs of one transaction, read in increasing vout order from a stream of them."""

    __slots__ = ("_at", "_it")

    def __init__(self, it: Iterator[tuple[int, int, bytes]]) -> None:
        self._it = it
        self._at: tuple[int, int, bytes] | None = None

    def get(self, vout: int, default: tuple[int, bytes] | None) -> tuple[int, bytes] | None:
        at = self._at
        while at is None or at[0] < vout:
            at = self._at = next(self._it, None)
            if at is None:
                return default
        return (at[1], at[2]) if at[0] == vout else default


def record_outputs(raw_format: int, raw: bytes | None) -> Outputs:
    """vout → (satoshis, script) of the outputs a record keeps (its raw formats are the SQL
    codec's, which the Aerospike bins use too)."""
    if raw is None:
        return {}
    if raw_format == codec.RAW_TX:
        return {v: (o.satoshis, o.script) for v, o in enumerate(tx_outputs(bytes(raw)))}
    if raw_format == codec.RAW_OUTPUTS:
        return slots.decode_outputs(bytes(raw))
    return {}


def no_blob(txid: bytes) -> StorageError:
    return StorageError(f"tx {hash_to_hex(txid)} is stored externally but its blob is missing")


class UtxoView:
    """`iter_utxos` over a backend's `_segments` and `_confirming` (see the module)."""

    external: ExternalTxs
    # the backend's: its records as segments, in a stable order (master, then its pages)
    _segments: Callable[[bool], Iterator[Segment]]
    # the backend's: those spenders the store holds mined on the best chain
    _confirming: Callable[[set[bytes]], set[bytes]]
    existing: Callable[[list[bytes]], set[bytes]]
    block_height: int

    def iter_utxos(self, *, confirmed: bool = True, script: bytes | None = None) -> Iterator[Utxo]:
        batch: list[Segment] = []
        held = 0
        memo: dict[bytes, OutputCursor] = {}
        for seg in self._segments(confirmed):
            batch.append(seg)
            held += len(seg[4])
            if len(batch) >= VIEW_CHUNK or held >= VIEW_BYTES:
                yield from self._emit(batch, confirmed, script, memo)
                batch, held = [], 0
        yield from self._emit(batch, confirmed, script, memo)

    def stats(self) -> UtxoStats:
        """The confirmed set's totals, counted over `iter_utxos` (a txid's UTXOs come together,
        so a change of txid is one more transaction)."""
        n = sats = txs = 0
        last = b""
        for u in self.iter_utxos(confirmed=True):
            n += 1
            sats += u.satoshis
            if u.txid != last:
                txs += 1
                last = u.txid
        return UtxoStats(utxos=n, satoshis=sats, txs=txs, height=self.block_height)

    def _external_tx(self, txid: bytes) -> Tx | None:
        """An external transaction's bytes, from its blob (which its record names: missing is a
        StorageError, not "no such tx")."""
        try:
            return self.external.get_tx(txid)
        except BlobNotFound:
            raise no_blob(txid) from None

    def _external_outputs(self, txid: bytes, vouts: list[int]) -> Outputs:
        try:
            return self.external.outputs(txid, vouts)
        except BlobNotFound:
            raise no_blob(txid) from None

    def _walk_external(self, txid: bytes) -> Iterator[tuple[int, int, bytes]]:
        try:
            yield from self.external.walk(txid)
        except BlobNotFound:
            if not self.existing([txid]):
                return  # pruned while the listing ran: it has no outputs to list any more
            raise no_blob(txid) from None

    def _emit(
        self, segments: list[Segment], confirmed: bool, script: bytes | None, memo: dict[bytes, OutputCursor]
    ) -> Iterator[Utxo]:
        """The live UTXOs of a chunk of records (see the module)."""
        live_of: list[list[int]] = []
        spent_by: list[list[tuple[int, bytes]]] = []
        spenders: set[bytes] = set()
        for _rec, _raw, _fmt, base, utxos in segments:
            live: list[int] = []
            pending: list[tuple[int, bytes]] = []
            for k in range(0, len(utxos), SLOT):
                if utxos.startswith(NO_HASH, k):
                    continue
                if utxos.startswith(UNSPENT, k + 32) or utxos.startswith(FROZEN, k + 32):  # (`slots.is_live`)
                    live.append(base + k // SLOT)
                elif confirmed:
                    spender = utxos[k + 32 : k + 64]
                    pending.append((base + k // SLOT, spender))
                    spenders.add(spender)
            live_of.append(live)
            spent_by.append(pending)
        mined = self._confirming(spenders) if spenders else set()
        for (rec, raw, fmt, _base, _u), live, pending in zip(segments, live_of, spent_by):
            if pending:
                # a pruned spender had been mined (only such records are pruned)
                pruned = set(rec.children("deleted_children")) if rec.deleted_children else set()
                live = sorted(live + [v for v, sp in pending if sp not in mined and sp not in pruned])
            if not live:
                continue
            outputs: OutputCursor | Outputs
            txid = rec.txid
            if rec.external:  # walk the blob's outputs, once, while this record's pages go by
                cur = memo.get(txid)
                if cur is None:
                    memo.clear()
                    cur = memo[txid] = OutputCursor(self._walk_external(txid))
                outputs = cur
            else:
                outputs = record_outputs(fmt, raw)
            height, coinbase = rec.height(), rec.is_coinbase
            for v in live:
                o = outputs.get(v, None)
                if o is None:
                    continue  # its record was pruned while this listing ran
                if script is None or o[1] == script:
                    yield Utxo(txid, v, o[0], o[1], height, coinbase)
