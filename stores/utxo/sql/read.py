"""Reads: records, spend status, outputs, the UTXO views and their totals.

Invariants:
- Reads take no locks and never change anything.
- The confirmed view is exactly CONTRACT.md's: outputs of transactions mined on the best chain
  (and not conflicting) that no transaction mined on the best chain has spent. Records are
  streamed in id order and spenders looked up a chunk at a time, so memory stays constant
  however many UTXOs there are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from chain import Tx, hash_to_hex, parse_tx
from chain.tx import tx_outputs
from stores.blob.protocol import BlobNotFound
from stores.utxo import slots, validate
from stores.utxo.errors import (
    Outpoint,
    ProcessingError,
    StorageError,
    TxCoinbaseImmature,
    TxConflicting,
    TxLocked,
    TxNotFound,
    UtxoFrozen,
    UtxoSpent,
)
from stores.utxo.records import OutputInfo, SpendInfo, SpendStatus, TxMeta, Utxo, UtxoStats
from stores.utxo.rules import check_spend
from stores.utxo.sql.base import split_inpoints
from stores.utxo.sql.create import RAW_OUTPUTS, RAW_TX, TX_COLS
from stores.utxo.sql.pages import PageMixin, PageRow
from stores.utxo.sql.spend import PARENT_COLS, Parent

FIELDS = frozenset(TxMeta._fields)
# A record whose multi-record creation is unfinished lists nothing until it is complete.
_MINED = "t.unmined_since IS NULL AND t.blocks <> '[]' AND t.conflicting = 0 AND t.creating = 0"
_VIEW_CHUNK = 1000
_VIEW_BYTES = 4 << 20


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
SLOT = slots.SLOT
NO_HASH, UNSPENT, FROZEN = slots.NO_HASH, slots.UNSPENT, slots.FROZEN


def record_outputs(raw_format: int, raw: bytes | None) -> dict[int, tuple[int, bytes]]:
    """vout → (satoshis, script) of the outputs a record keeps."""
    if raw is None:
        return {}
    if raw_format == RAW_TX:
        return {v: (o.satoshis, o.script) for v, o in enumerate(tx_outputs(bytes(raw)))}
    if raw_format == RAW_OUTPUTS:
        return slots.decode_outputs(bytes(raw))
    return {}


class ReadMixin(PageMixin):
    def get(self, txid: bytes, fields: Sequence[str] | None = None) -> TxMeta:
        validate.hash32("txid", txid)
        if fields is not None:
            unknown = set(fields) - FIELDS
            if unknown:
                raise ProcessingError(f"unknown record fields: {', '.join(sorted(unknown))}")

        def q(cur: Any) -> Any:
            cur.execute(self._q(f"SELECT {TX_COLS} FROM txs WHERE txid = ?"), (txid,))
            row = cur.fetchone()
            return None if row is None else row[1:]  # drop the internal id

        r = self._run_read("get", q)
        if r is None:
            raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
        blocks = json.loads(r[18])
        kids = bytes(r[19])
        meta = TxMeta(
            txid=bytes(r[0]),
            version=r[1],
            locktime=r[2],
            fee=r[3],
            size_in_bytes=r[4],
            is_coinbase=bool(r[5]),
            spending_height=r[6],
            locked=bool(r[7]),
            creating=bool(r[8]),
            conflicting=bool(r[9]),
            unmined_since=r[10],
            created_at=r[11],
            preserve_until=r[12],
            delete_at_height=r[13],
            external=bool(r[14]),
            total_extra_recs=r[15],
            total_utxos=r[16],
            spent_utxos=r[17],
            block_ids=[b[0] for b in blocks],
            block_heights=[b[1] for b in blocks],
            subtree_idxs=[b[2] for b in blocks],
            conflicting_children=[kids[i : i + 32] for i in range(0, len(kids), 32)],
            reassignments=json.loads(r[20]),
            inpoints=split_inpoints(bytes(r[22])),
        )
        if fields is None or "tx" in fields:
            if r[24] == RAW_TX:
                meta = meta._replace(tx=parse_tx(bytes(r[25])))
            elif meta.external:
                meta = meta._replace(tx=self._external_tx(meta.txid))
        return meta

    def _external_tx(self, txid: bytes) -> Tx | None:
        try:
            return self.external.get_tx(txid)
        except BlobNotFound:
            raise StorageError(
                f"tx {hash_to_hex(txid)} is stored externally but its blob is missing"
            ) from None

    def _walk_external(self, txid: bytes) -> Iterator[tuple[int, int, bytes]]:
        try:
            yield from self.external.walk(txid)
        except BlobNotFound:
            if not self._exists(txid):
                return  # pruned while the listing ran: it has no outputs to list any more
            raise StorageError(
                f"tx {hash_to_hex(txid)} is stored externally but its blob is missing"
            ) from None

    def _exists(self, txid: bytes) -> bool:
        return bool(self._run_read("get", lambda cur: self._select_txs(cur, "txid", [txid], False)))

    def _outputs_of(
        self, txid: bytes, raw_format: int, raw: bytes | None, external: bool, vouts: list[int]
    ) -> dict[int, tuple[int, bytes]]:
        if external:
            try:
                return self.external.outputs(txid, vouts)
            except BlobNotFound:
                raise StorageError(
                    f"tx {hash_to_hex(txid)} is stored externally but its blob is missing"
                ) from None
        return record_outputs(raw_format, raw)

    def existing(self, txids: Sequence[bytes], conflicting: bool = False) -> set[bytes]:
        """Those of `txids` the store holds a record of (only conflicting ones, if asked)."""
        return self._those_kept("existing", txids, "conflicting", lambda r: bool(r[1]) or not conflicting)

    def mined(self, txids: Sequence[bytes]) -> set[bytes]:
        """Those of `txids` mined on the longest chain (in a block, `unmined_since` unset)."""
        return self._those_kept("mined", txids, "unmined_since, blocks",
                                 lambda r: r[1] is None and r[2] != "[]")

    def _those_kept(
        self, what: str, txids: Sequence[bytes], cols: str, keep: Callable[[Any], bool]
    ) -> set[bytes]:
        """Those of `txids` whose record's row (txid, then `cols`) `keep` accepts."""
        validate.txids(txids)

        def q(cur: Any) -> set[bytes]:
            found: set[bytes] = set()
            for part in self._chunks(sorted(set(txids))):
                rows = self._select_txs(cur, f"txid, {cols}", part, False)
                found.update(bytes(r[0]) for r in rows if keep(r))
            return found

        return self._run_read(what, q)

    def snapshot_block(self) -> tuple[int, bytes] | None:
        """(height, hash) of the block a UTXO snapshot was imported at, if one was."""

        def q(cur: Any) -> Any:
            cur.execute("SELECT value FROM meta WHERE key = 'snapshot_block'")
            return cur.fetchone()

        r = self._run_read("snapshot_block", q)
        if r is None:
            return None
        height, hexhash = r[0].split(":", 1)
        return int(height), bytes.fromhex(hexhash)[::-1]

    def get_outputs(self, outpoints: Sequence[Outpoint]) -> dict[Outpoint, OutputInfo]:
        validate.outpoints(outpoints)
        wanted: dict[bytes, list[int]] = {}
        for t, v in outpoints:
            wanted.setdefault(t, []).append(v)

        size = self.batch_size

        def q(cur: Any) -> tuple[list[Any], dict[tuple[bytes, int], bytes]]:
            rows = []
            for part in self._chunks(sorted(wanted)):
                rows += self._select_txs(
                    cur, "txid, utxos, spendable_in, raw_format, raw, external, total_extra_recs", part, False
                )
            keys = {(bytes(r[0]), v // size) for r in rows if r[6] for v in wanted[bytes(r[0])] if v >= size}
            pages = {k: bytes(pg.utxos) for k, pg in self._lock_pages(cur, keys, lock=False).items()}
            return rows, pages

        out: dict[Outpoint, OutputInfo] = {}
        rows, pages = self._run_read("get_outputs", q)
        for r in rows:
            txid, utxos = bytes(r[0]), bytes(r[1])
            spendable = json.loads(r[2])
            outputs: dict[int, tuple[int, bytes]] | None = None
            for vout in wanted[txid]:
                buf, pos = utxos, vout
                if r[6] and vout >= size:
                    buf, pos = pages.get((txid, vout // size), b""), vout % size
                h, sp_txid, sp_vin, frozen = (
                    slots.decode(buf[pos * SLOT : pos * SLOT + SLOT])
                    if (pos * SLOT + SLOT <= len(buf))
                    else (None, None, None, False)
                )
                if h is None:
                    continue
                if outputs is None:
                    outputs = self._outputs_of(txid, r[3], r[4], bool(r[5]), wanted[txid])
                sats, script = outputs.get(vout, (0, b""))
                out[(txid, vout)] = OutputInfo(
                    txid, vout, h, sats, script, sp_txid, sp_vin, frozen, spendable.get(str(vout))
                )
        return out

    def get_output(self, outpoint: Outpoint) -> OutputInfo | None:
        return self.get_outputs([outpoint]).get(outpoint)

    def get_spend(self, outpoint: Outpoint, utxo_hash: bytes) -> SpendInfo:
        """The state of one output, judged at the store's current height (read afresh: another
        process may have moved it on)."""
        validate.outpoints([outpoint])
        validate.hash32("utxo_hash", utxo_hash)

        size = self.batch_size

        def q(cur: Any) -> tuple[list[Any], int, dict[tuple[bytes, int], PageRow]]:
            rows = self._select_txs(cur, PARENT_COLS, [outpoint[0]], False)
            pages = {}
            if rows and rows[0][16] and outpoint[1] >= size:
                pages = self._lock_pages(cur, [(outpoint[0], outpoint[1] // size)], lock=False)
            return rows, self._stored_height(cur), pages

        rows, height, pages = self._run_read("get_spend", q)
        p = Parent(rows[0]) if rows else None
        if p is not None and rows[0][16]:
            p.page_size = size
            p.pages = {k: pg for (_t, k), pg in pages.items()}
            page = p.pages.get(outpoint[1] // size) if outpoint[1] >= size else None
            if page is not None and page.creating:
                return SpendInfo(SpendStatus.LOCKED)
        err = check_spend(
            outpoint,
            utxo_hash,
            (b"", -1),
            max(height, self.block_height),
            None if p is None else p.check,
            None if p is None else p.output(outpoint[1]),
        )
        if err is None:
            return SpendInfo(SpendStatus.OK)
        if isinstance(err, UtxoSpent):
            return SpendInfo(SpendStatus.SPENT, err.spending_txid, err.spending_vin)
        if isinstance(err, TxLocked):
            return SpendInfo(SpendStatus.LOCKED)
        if isinstance(err, TxConflicting):
            return SpendInfo(SpendStatus.CONFLICTING)
        if isinstance(err, TxCoinbaseImmature):
            return SpendInfo(SpendStatus.IMMATURE, until=err.spendable_at)
        if isinstance(err, UtxoFrozen):
            return SpendInfo(SpendStatus.FROZEN, until=err.until)
        return SpendInfo(SpendStatus.NOT_FOUND)

    def iter_utxos(self, *, confirmed: bool = True, script: bytes | None = None) -> Iterator[Utxo]:
        where = _MINED if confirmed else "t.conflicting = 0 AND t.creating = 0"
        sql = (
            "SELECT t.txid, t.utxos, t.raw_format, t.raw, t.blocks, t.is_coinbase, t.external, "
            f"t.total_extra_recs FROM txs t WHERE {where} ORDER BY t.id"
        )
        # Segments: (record row, vout of its first slot, slots) — a record's master, then each
        # of its child pages, read one at a time.
        # A chunk is emitted at _VIEW_CHUNK segments or _VIEW_BYTES of slots, whichever first,
        # so a record of a million outputs goes by a page or so at a time.
        batch: list[tuple[Any, int, bytes]] = []
        held = 0
        memo: dict[bytes, OutputCursor] = {}
        size = self.batch_size

        def segments() -> Iterator[tuple[Any, int, bytes]]:
            for r in self._stream(self._q(sql), ()):
                yield r, 0, bytes(r[1])
                if r[7]:
                    for k, page in self._page_slots(bytes(r[0])):
                        yield r, k * size, page

        try:
            for seg in segments():
                batch.append(seg)
                held += len(seg[2])
                if len(batch) >= _VIEW_CHUNK or held >= _VIEW_BYTES:
                    yield from self._emit(batch, confirmed, script, memo)
                    batch, held = [], 0
            yield from self._emit(batch, confirmed, script, memo)
        except self._db_errors() as e:
            raise StorageError(f"listing UTXOs failed in {self.url_safe}: {e}") from e

    def _emit(
        self,
        segments: list[tuple[Any, int, bytes]],
        confirmed: bool,
        script: bytes | None,
        memo: dict[bytes, OutputCursor],
    ) -> Iterator[Utxo]:
        """The live UTXOs of a chunk of records. A slot is live when it has a hash and either no
        spending data, frozen (frozen is not spent), or — in the confirmed view — a spender that
        is stored but not mined on the best chain (looked up once for the whole chunk)."""
        live_of: list[list[int]] = []
        spent_by: list[list[tuple[int, bytes]]] = []
        spenders: set[bytes] = set()
        for _r, base, utxos in segments:
            live: list[int] = []
            pending: list[tuple[int, bytes]] = []
            for k in range(0, len(utxos), SLOT):
                if utxos.startswith(NO_HASH, k):
                    continue
                if utxos.startswith(UNSPENT, k + 32) or utxos.startswith(FROZEN, k + 32):
                    live.append(base + k // SLOT)
                elif confirmed:
                    spender = utxos[k + 32 : k + 64]
                    pending.append((base + k // SLOT, spender))
                    spenders.add(spender)
            live_of.append(live)
            spent_by.append(pending)
        unconfirmed = self._unconfirmed(spenders) if spenders else set()
        heights: dict[str, int | None] = {}
        for (r, _base, _u), live, pending in zip(segments, live_of, spent_by):
            if pending:
                live = sorted(live + [v for v, sp in pending if sp in unconfirmed])
            if not live:
                continue
            outputs: OutputCursor | dict[int, tuple[int, bytes]]
            if r[6]:  # external: walk the blob's outputs, once, while this record's pages go by
                cur = memo.get(bytes(r[0]))
                if cur is None:
                    memo.clear()
                    cur = memo[bytes(r[0])] = OutputCursor(self._walk_external(bytes(r[0])))
                outputs = cur
            else:
                outputs = record_outputs(r[2], r[3])
            blocks = r[4]
            height = heights.get(blocks, -1)
            if height == -1:
                hs = [b[1] for b in json.loads(blocks)]
                height = heights[blocks] = min(hs) if hs else None
            txid, coinbase = bytes(r[0]), bool(r[5])
            for v in live:
                o = outputs.get(v, None)
                if o is None:
                    continue  # its record was pruned while this listing ran
                if script is None or o[1] == script:
                    yield Utxo(txid, v, o[0], o[1], height, coinbase)

    def _unconfirmed(self, txids: set[bytes]) -> set[bytes]:
        """Those spenders that do not make a spend confirmed: stored, but not mined on the best
        chain. A spender the store no longer holds counts as confirmed: only records mined on
        the best chain (or conflicting ones, whose spends the chain logic takes back) are ever
        pruned, and a parent can outlive its spenders."""

        def q(cur: Any) -> set[bytes]:
            found: set[bytes] = set()
            for part in self._chunks(sorted(txids)):
                found.update(
                    bytes(r[0]) for r in self._select_txs(cur, "txid, unmined_since, blocks", part, False)
                    if r[1] is not None or r[2] == "[]"
                )
            return found

        return self._run_read("spender lookup", q)

    def stats(self) -> UtxoStats:
        n = sats = txs = 0
        last = b""
        for u in self.iter_utxos(confirmed=True):  # grouped by record: count txid changes
            n += 1
            sats += u.satoshis
            if u.txid != last:
                txs += 1
                last = u.txid
        return UtxoStats(utxos=n, satoshis=sats, txs=txs, height=self.block_height)
