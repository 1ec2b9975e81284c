"""Reads on Aerospike: records, spend status, outputs, the UTXO views and their totals — the SQL
backend's (`stores.utxo.sql.read`), whose backend-neutral helpers are used as they are.

Invariants:
- Reads never change a record and take no lock; a master is read as a `Record` (`codec`), and
  every verdict on one is the kernel's (`Record.mined`, `Record.locate`, `meta_of`) or, for
  GetSpend, the Lua module's port of it, judged at the store's height read afresh.
- Output vout of a multi-record transaction is read from child page vout // batch_size, and
  only the pages holding wanted outputs are read.
- The confirmed view is exactly CONTRACT.md's, as the SQL backend lists it: masters (page 0,
  not conflicting, not creating; confirmed: mined) are filtered on the server and fetched a
  query page at a time, each one's child pages read right after it a few at a time, spenders
  looked up a chunk at a time; so memory stays bounded however many UTXOs there are, and the
  UTXOs of one transaction come together (records in no particular order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from chain import Tx, hash_to_hex, parse_tx
from stores.utxo import slots, validate
from stores.utxo.aerospike import codec
from stores.utxo.aerospike.base import BATCH
from stores.utxo.aerospike.create import CreateMixin
from stores.utxo.errors import Outpoint, ProcessingError, TxNotFound
from stores.utxo.kernel.record import Record, meta_of, spenders
from stores.utxo.sql import codec as sql_codec
from stores.utxo.sql.read import FIELDS
from stores.utxo.values import OutputInfo, Spenders, SpendInfo, Standing, TxMeta
from stores.utxo.view import VIEW_BYTES, Outputs, Segment, UtxoView, record_outputs

# record_outputs reads the SQL codec's raw formats: the bins must mean the same by them
assert (codec.RAW_TX, codec.RAW_OUTPUTS) == (sql_codec.RAW_TX, sql_codec.RAW_OUTPUTS)

SLOT, NO_HASH, UNSPENT, FROZEN = slots.SLOT, slots.NO_HASH, slots.UNSPENT, slots.FROZEN
UNMINED, CONFLICTING, CREATING = (codec.BINS[f] for f in ("unmined_since", "conflicting", "creating"))
# a master's bins without its transaction's bytes (a `get` that does not want the tx)
META_BINS = [*codec.BINS.values(), *codec.BLOCK_BINS, codec.PAGE_SPENT, codec.SPENDABLE_IN,
             codec.REASSIGNMENTS]  # fmt: skip
MINED_BINS = [UNMINED, codec.BLOCK_BINS[0]]
SLOT_BINS = ["txid", "utxos", "totalExtraRecs", CONFLICTING]  # an output's slot, and its flag
VIEW_BINS = [
    "txid", "utxos", "totalExtraRecs", "external", "coinbase", *codec.BLOCK_BINS, codec.RAW, codec.RAW_FORMAT,
    codec.BINS["deleted_children"],
]  # fmt: skip
# masters per query page: what a listing holds of the query at once (records of ~1 KB as a
# rule; max-record-size at worst)
QUERY_PAGE = 1000
PROBE_PAGES = 20 * BATCH  # child pages looked up by key (in batches) rather than found by a scan


def _mined(bins: dict[str, Any]) -> bool:
    """`Record.mined` on a master's bins (`MINED_BINS`): in a block, not marked off the chain."""
    return bins.get(UNMINED) is None and bool(bins.get(codec.BLOCK_BINS[0]))


def _view_filter(confirmed: bool) -> Any:
    """The masters a view lists, as a server-side filter (the SQL view's WHERE clause)."""
    from aerospike_helpers import expressions as exp

    def clear(flag: str) -> Any:  # a false flag may be no bin at all (`codec.AT_DEFAULT`)
        return exp.Eq(exp.Cond(exp.BinExists(flag), exp.IntBin(flag), 0), 0)

    terms = [exp.Eq(exp.IntBin("page"), 0), clear(CONFLICTING), clear(CREATING)]
    if confirmed:  # mined: an absent blockIDs bin leaves the filter unknown, i.e. not listed
        terms += [
            exp.Not(exp.BinExists(UNMINED)),
            exp.GT(exp.ListSize(None, exp.ListBin(codec.BLOCK_BINS[0])), 0),
        ]
    return exp.And(*terms).compile()


class ReadMixin(CreateMixin, UtxoView):
    def get(self, txid: bytes, fields: Sequence[str] | None = None) -> TxMeta:
        validate.hash32("txid", txid)
        if fields is not None:
            unknown = set(fields) - FIELDS
            if unknown:
                raise ProcessingError(f"unknown record fields: {', '.join(sorted(unknown))}")
        with_tx = fields is None or "tx" in fields
        (bins,) = self._read_bins([self.key(txid)], None if with_tx else META_BINS)
        if bins is None:
            raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
        rec = codec.from_bins(bins)
        tx: Tx | None = None
        if with_tx:
            if bins.get(codec.RAW_FORMAT) == codec.RAW_TX:
                tx = parse_tx(bytes(bins[codec.RAW]))
            elif rec.external:
                tx = self._external_tx(txid)
        return meta_of(rec, tx)

    def _outputs_of(self, rec: Record, bins: dict[str, Any], vouts: list[int]) -> Outputs:
        if rec.external:
            return self._external_outputs(rec.txid, vouts)
        return record_outputs(int(bins.get(codec.RAW_FORMAT) or 0), bins.get(codec.RAW))

    # -- which of these txids ---------------------------------------------------------------------
    def _found(self, txids: Sequence[bytes], bins: Sequence[str]) -> dict[bytes, dict[str, Any]]:
        """The `bins` of the masters of those `txids` the store holds."""
        validate.txids(txids)
        wanted = list(dict.fromkeys(txids))
        got = self._read_bins([self.key(t) for t in wanted], bins)
        return {t: b for t, b in zip(wanted, got) if b is not None}

    def existing(self, txids: Sequence[bytes], conflicting: bool = False) -> set[bytes]:
        """Those of `txids` the store holds a record of (only conflicting ones, if asked)."""
        found = self._found(txids, [CONFLICTING])
        return {t for t, b in found.items() if not conflicting or b.get(CONFLICTING) == 1}

    def mined(self, txids: Sequence[bytes]) -> set[bytes]:
        """Those of `txids` mined on the longest chain (`Record.mined`)."""
        return {t for t, b in self._found(txids, MINED_BINS).items() if _mined(b)}

    def standing(self, txids: Sequence[bytes]) -> dict[bytes, Standing]:
        found = self._found(txids, [*MINED_BINS, CONFLICTING])
        return {t: Standing(_mined(b), b.get(CONFLICTING) == 1) for t, b in found.items()}

    def snapshot_block(self) -> tuple[int, bytes] | None:
        """(height, hash) of the block a UTXO snapshot was imported at, if one was."""
        r = self._meta().get("snapshot")
        if r is None:
            return None
        height, hexhash = str(r).split(":", 1)
        return int(height), bytes.fromhex(hexhash)[::-1]

    # -- outputs ----------------------------------------------------------------------------------
    def get_outputs(self, outpoints: Sequence[Outpoint]) -> dict[Outpoint, OutputInfo]:
        validate.outpoints(outpoints)
        wanted: dict[bytes, list[int]] = {}
        for t, v in outpoints:
            wanted.setdefault(t, []).append(v)
        masters = self._found(list(wanted), [*META_BINS, codec.RAW, codec.RAW_FORMAT])
        recs = {t: codec.from_bins(b) for t, b in masters.items()}
        size = self.batch_size
        self._load_pages(recs, outpoints)
        out: dict[Outpoint, OutputInfo] = {}
        for t, rec in recs.items():
            spendable = rec.spendable()  # the master keeps every page's reassigned outputs
            outputs: Outputs | None = None
            for vout in wanted[t]:
                loc = rec.locate(vout, size)
                if loc is None:
                    continue
                h, sp_txid, sp_vin, frozen = slots.decode(bytes(loc[0].utxos[loc[1] : loc[1] + SLOT]))
                assert h is not None
                if outputs is None:
                    outputs = self._outputs_of(rec, masters[t], wanted[t])
                sats, spk = outputs.get(vout, (0, b""))
                out[(t, vout)] = OutputInfo(
                    t, vout, h, sats, spk, sp_txid, sp_vin, frozen, spendable.get(vout),
                    rec.height(), rec.is_coinbase,
                )
        return out

    def get_output(self, outpoint: Outpoint) -> OutputInfo | None:
        return self.get_outputs([outpoint]).get(outpoint)

    def spenders(self, outpoints: Sequence[Outpoint]) -> Spenders:
        validate.outpoints(outpoints)
        want = sorted(set(outpoints))
        found = self._found([t for t, _v in want], SLOT_BINS)
        recs = {t: codec.from_bins(b) for t, b in found.items()}
        self._load_pages(recs, want)
        return spenders(recs, want, self.batch_size)

    def _load_pages(self, recs: dict[bytes, Record], want: Iterable[Outpoint]) -> None:
        """Add to these masters the child pages that hold the outpoints `want` (a page that is
        missing stays so: its outputs are not found)."""
        size = self.batch_size
        multi = {t for t, rec in recs.items() if rec.total_extra_recs}
        keys = sorted({(t, v // size) for t, v in want if v >= size and t in multi})
        for (t, k), b in zip(keys, self._read_bins([self.key(t, k) for t, k in keys])):
            if b is not None:
                recs[t].pages[k] = codec.from_bins(b)

    def get_spend(self, outpoint: Outpoint, utxo_hash: bytes) -> SpendInfo:
        """What a spend of the output in the next block would meet (`kernel.spend.spend_status`,
        run by the Lua module), judged at the store's current height, read afresh (another
        process may have moved it)."""
        validate.outpoints([outpoint])
        validate.hash32("utxo_hash", utxo_hash)
        return self.rules.get_spend(outpoint, utxo_hash, self.current_height())

    # -- the UTXO views ---------------------------------------------------------------------------
    def _stream(self, what: str, bins: Sequence[str], expression: Any) -> Iterator[dict[str, Any]]:
        """The bins of every record of the set passing `expression`, a query page at a time
        (`_query` holds every answer before it yields the first)."""
        from aerospike import exception as aex

        q = self.conn.client.query(self.conn.namespace, self.conn.set)
        q.select(*bins)
        q.max_records = QUERY_PAGE
        q.paginate()
        policy: dict[str, Any] = {"total_timeout": 0}
        if expression is not None:
            policy["expressions"] = expression
        while True:
            try:
                page = q.results(policy)
                done = q.is_done()
            except aex.AerospikeError as e:
                raise self._fail(what, e) from e
            yield from (r[2] for r in page)
            if done:
                return

    def _segments(self, confirmed: bool) -> Iterator[Segment]:
        """The listed masters, each followed by its child pages (in index order, read a few at
        a time: a record of a million outputs goes by a page or so at a time)."""
        size = self.batch_size
        per_read = max(1, VIEW_BYTES // (size * SLOT))
        for bins in self._stream("listing UTXOs", VIEW_BINS, _view_filter(confirmed)):
            rec = codec.from_bins(bins)
            raw, fmt = bins.get(codec.RAW), int(bins.get(codec.RAW_FORMAT) or 0)
            yield rec, raw, fmt, 0, bytes(rec.utxos)
            if not rec.total_extra_recs:
                continue
            pages = self._child_pages(rec)
            for at in range(0, len(pages), per_read):
                ks = pages[at : at + per_read]
                for k, page in zip(ks, self._read_bins([self.key(rec.txid, k) for k in ks], ["utxos"])):
                    if page is not None:  # pruned while the listing ran
                        yield rec, raw, fmt, k * size, bytes(page.get("utxos") or b"")

    def _child_pages(self, rec: Record) -> list[int]:
        """The indexes of the child pages `rec` has, increasing. A snapshot record has only the
        pages its listed outputs need, up to ~a billion apart (vout 2**32-1): past PROBE_PAGES
        the set is asked which pages of it exist rather than each index looked up."""
        txid, extra = rec.txid, rec.total_extra_recs
        if extra > PROBE_PAGES:
            from aerospike_helpers import expressions as exp

            mine = exp.And(exp.Eq(exp.BlobBin("txid"), txid), exp.GT(exp.IntBin("page"), 0)).compile()
            return sorted(
                int(b["page"]) for b in self._query("listing a record's pages", ["page"], None, mine)
            )
        there: list[int] = []
        for first in range(1, extra + 1, BATCH):
            ks = range(first, min(first + BATCH, extra + 1))
            there += [k for k, e in zip(ks, self._exists([self.key(txid, k) for k in ks])) if e]
        return there

    def _confirming(self, txids: set[bytes]) -> set[bytes]:
        """Those spenders the store holds mined on the best chain (`UtxoView`)."""
        return {t for t, b in self._found(sorted(txids), MINED_BINS).items() if _mined(b)}

