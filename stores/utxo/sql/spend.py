"""Spending, unspending, and the per-output states freeze / unfreeze / reassign.

Invariants:
- A transaction's spend is all-or-nothing: its inputs are checked against the parent records
  read under lock (and against earlier transactions of the same batch), and only a transaction
  whose every input passes has its spends written.
- `spent_utxos` of a record always equals the number of its slots holding spending data, and
  its delete-at-height is recomputed in the same database transaction that changes the count.
- Unspend clears only a spend whose stored spender (txid and input index) equals the one given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from hashlib import sha256
from typing import Any

from chain import Tx, hash_to_hex, utxo_hash
from chain.tx import varint
from stores.utxo import slots, validate
from stores.utxo.errors import (
    Outpoint,
    ProcessingError,
    SpendRejected,
    TxCreating,
    TxNotFound,
    UtxoError,
    UtxoMismatch,
    UtxoNotFound,
    UtxoSpent,
    fmt_outpoint,
)
from stores.utxo.gcpause import gc_paused
from stores.utxo.records import Spend
from stores.utxo.rules import REASSIGN_DELAY, check_spend, next_dah
from stores.utxo.sql.pages import PageMixin, PageRow

# `Parent` reads these by position.
PARENT_COLS = (
    "id, txid, creating, conflicting, locked, is_coinbase, spending_height, total_utxos, "
    "spent_utxos, unmined_since, preserve_until, delete_at_height, blocks, utxos, spendable_in, "
    "reassignments, total_extra_recs"
)
SET_SPENDS = "UPDATE txs SET utxos = ?, spent_utxos = ?, delete_at_height = ? WHERE id = ?"
SET_OUTPUT_STATE = (
    "UPDATE txs SET utxos = ?, spent_utxos = ?, delete_at_height = ?, spendable_in = ?, "
    "reassignments = ? WHERE id = ?"
)
SLOT = slots.SLOT
Loc = tuple[bytearray, int, PageRow | None]  # (slots buffer, slot offset, child page or None)
_NO_PAGES: dict[int, PageRow] = {}  # shared and never written: a one-record parent has no pages
UNSPENT = slots.UNSPENT
NO_HASH = slots.NO_HASH


class Parent:
    """A parent record read under lock: its counters and a mutable copy of its slots. The rest
    of the row is decoded only when a rule needs it: the fast path of a block's spends reads
    nothing but the flags, the slots and the counters."""

    __slots__ = (
        "_spendable", "changed", "dah", "id", "page_size", "pages", "reassignments", "row", "spent",
        "total", "utxos",
    )

    def __init__(self, r: tuple[Any, ...]) -> None:
        self.row = r
        self.id = r[0]
        self.total = r[7]
        self.spent = r[8]
        self.dah = r[11]
        self.utxos = bytearray(r[13])
        self.reassignments: str = r[15]
        self._spendable: dict[str, int] | None = None
        self.changed = False
        # A multi-record transaction: outputs from `page_size` on live in child pages, of which
        # those an operation needs are loaded (under the master's lock) into `pages`.
        self.page_size = 0
        self.pages: dict[int, PageRow] = _NO_PAGES  # replaced by a dict of its own when paged

    @property
    def check(self) -> tuple[bool, bool, bool, bool, int]:
        """(creating, conflicting, locked, is_coinbase, spending_height), as `check_spend` takes it."""
        r = self.row
        return bool(r[2]), bool(r[3]), bool(r[4]), bool(r[5]), r[6]

    def plain(self, block_height: int) -> bool:
        """No rule but the slot's own can refuse a spend of this record at this height."""
        r = self.row
        return not (r[2] or r[3] or r[4] or r[16]) and r[14] == "{}" and not (r[5] and block_height < r[6])

    @property
    def spendable(self) -> dict[str, int]:
        """Per-output `utxo_spendable_in` heights (mutable: reassign adds to it)."""
        if self._spendable is None:
            s = self.row[14]
            self._spendable = json.loads(s) if s != "{}" else {}
        return self._spendable

    def locate(self, vout: int) -> tuple[bytearray, int, PageRow | None] | None:
        """(slots buffer, offset of the output's slot in it, its child page or None for the
        master), or None when no such slot is stored."""
        size = self.page_size
        if size and vout >= size:
            k = vout // size
            page = self.pages.get(k)
            if page is None:
                return None
            buf, off = page.utxos, (vout - k * size) * SLOT
        else:
            buf, off, page = self.utxos, vout * SLOT, None
        if off + SLOT > len(buf):
            return None
        return buf, off, page

    def mark(self, page: PageRow | None, spent: int = 0) -> None:
        """Record a change of a slot (and `spent` more spent slots) in the master or a page."""
        self.changed = True
        self.spent += spent
        if page is not None:
            page.changed = True
            page.spent += spent

    def output(self, vout: int) -> tuple[bytes, bytes | None, int | None, bool, int | None] | None:
        """(utxo_hash, spending_txid, spending_vin, frozen, spendable_in), or None: no such UTXO."""
        loc = self.locate(vout)
        if loc is None:
            return None
        buf, off, _page = loc
        slot = bytes(buf[off : off + SLOT])
        h, sp_txid, sp_vin, frozen = slots.decode(slot)
        if h is None:
            return None
        return h, sp_txid, sp_vin, frozen, self.spendable.get(str(vout))

    def new_dah(self, height: int, retention: int) -> int | None:
        r = self.row
        return next_dah(
            current=self.dah,
            conflicting=bool(r[3]),
            locked=bool(r[4]),
            preserve_until=r[10],
            spent=self.spent,
            utxos=self.total,
            mined_on_longest=r[9] is None and r[12] != "[]",
            height=height,
            retention=retention,
        )


def _plan(tx: Tx) -> list[tuple[int, bytes, int, bytes | None]]:
    """(vin, parent txid, vout, expected utxo hash or None) of each input."""
    return [
        (
            vin, i.prev_txid, i.prev_vout,
            utxo_hash(i.prev_txid, i.prev_vout, i.prev_script, i.prev_satoshis)
            if i.prev_script is not None and i.prev_satoshis is not None
            else None,
        )
        for vin, i in enumerate(tx.inputs)
    ]


class SpendMixin(PageMixin):
    def _lock_parents(
        self, cur: Any, txids: set[bytes], want: Iterable[tuple[bytes, int]] = ()
    ) -> dict[bytes, Parent]:
        """The parent records of `txids` under lock, with the child pages that hold the
        outpoints in `want` (only multi-record parents have any)."""
        parents: dict[bytes, Parent] = {}
        paged = False
        for part in self._chunks(sorted(txids)):
            for r in self._select_txs(cur, PARENT_COLS, part, True):
                p = parents[bytes(r[1])] = Parent(r)
                if r[16]:
                    p.page_size = self.batch_size
                    p.pages = {}
                    paged = True
        if paged:
            size = self.batch_size
            keys = {
                (t, v // size) for t, v in want
                if v >= size and (q := parents.get(t)) is not None and q.page_size
            }
            for (t, k), page in self._lock_pages(cur, keys).items():
                parents[t].pages[k] = page
        return parents

    def _write_pages_of(self, cur: Any, parents: Iterable[Parent]) -> None:
        self._write_pages(cur, (pg for p in parents if p.pages for pg in p.pages.values()))

    def spend(self, tx: Tx, block_height: int) -> list[Spend]:
        (r,) = self.spend_many([tx], block_height)
        if isinstance(r, UtxoError):
            raise r
        return r

    @gc_paused
    def spend_many(
        self, txs: Sequence[Tx], block_height: int, missing_ok: bool = False
    ) -> list[list[Spend] | UtxoError]:
        """Spend every input of each tx (all or nothing per tx). With `missing_ok`, an input
        whose parent record the store does not hold is skipped instead of failing its tx (for
        a chain imported from mid-history): the tx's spends then list only the others."""
        validate.height("block_height", block_height)
        parent_ids = {i.prev_txid for tx in txs for i in tx.inputs}
        parent_ids.discard(NO_HASH)  # a coinbase's input names no parent
        height = self._height(block_height)

        def unit(cur: Any) -> list[list[Spend] | UtxoError]:
            parents = self._lock_parents(
                cur, parent_ids, ((i.prev_txid, i.prev_vout) for tx in txs for i in tx.inputs)
            )
            # `Parent.plain`, inlined: it runs for every parent of every block.
            fast = {
                t: p for t, p in parents.items()
                if not ((r := p.row)[2] or r[3] or r[4] or r[16]) and r[14] == "{}"
                and not (r[5] and block_height < r[6])
            }
            results: list[list[Spend] | UtxoError] = []
            get = fast.get
            new = tuple.__new__
            for tx in txs:
                # Fast path: every input is an unspent slot, with the hash its extended data
                # gives, of a parent that needs no further rule — the common case in a block.
                # Anything else walks every rule in `_spend_one`.
                txid = tx.txid
                ins = tx.inputs
                if len(ins) == 1 and ins[0].prev_vout == 0xFFFFFFFF and ins[0].prev_txid == NO_HASH:
                    results.append([])
                    continue
                spends: list[Spend] = []
                picked: list[tuple[Parent, int, int]] = []
                for vin, i in enumerate(ins):
                    ptxid = i.prev_txid
                    p = get(ptxid)
                    if p is None:
                        break
                    u = p.utxos
                    vout = i.prev_vout
                    off = vout * SLOT
                    if not u.startswith(UNSPENT, off + 32):  # (no slot there: False too)
                        break
                    ps, pscript = i.prev_satoshis, i.prev_script
                    if pscript is not None and ps is not None:
                        # utxo_hash inlined: this runs once per input of every block
                        if ps < 0xFD:
                            sb = bytes((ps,))
                        elif ps > 0xFFFFFFFF:
                            sb = b"\xff" + ps.to_bytes(8, "little")
                        elif ps > 0xFFFF:
                            sb = b"\xfe" + ps.to_bytes(4, "little")
                        else:
                            sb = b"\xfd" + ps.to_bytes(2, "little")
                        h = sha256(
                            ptxid + (bytes((vout,)) if vout < 0xFD else varint(vout)) + pscript + sb
                        ).digest()
                        if not u.startswith(h, off):
                            break
                    else:
                        h = bytes(u[off : off + 32])
                        if h == NO_HASH:
                            break
                    spends.append(new(Spend, (ptxid, vout, h, txid, vin)))
                    picked.append((p, off, vin))
                else:
                    n = len(picked)
                    if n < 2 or (
                        (picked[0][0] is not picked[1][0] or picked[0][1] != picked[1][1])
                        if n == 2
                        else len({(p.id, off) for p, off, _v in picked}) == n
                    ):
                        for p, off, vin in picked:
                            p.utxos[off + 32 : off + SLOT] = txid + vin.to_bytes(4, "little")
                            p.spent += 1
                            p.changed = True
                        results.append(spends)
                        continue
                results.append(self._spend_one(txid, _plan(tx), parents, block_height, missing_ok))
            rows = []
            for p in parents.values():
                if p.changed:
                    # A spend only adds spending data: a record still holding unspent outputs
                    # keeps the DAH it had (None, unless conflicting), so ask the rule only
                    # once a record is fully spent.
                    if p.spent >= p.total or p.dah is not None:
                        p.dah = p.new_dah(height, self.retention)
                    rows.append((p.utxos, p.spent, p.dah, p.id))  # a bytearray binds as a blob
            if rows:
                cur.executemany(self._q(SET_SPENDS), rows)
                self._write_pages_of(cur, parents.values())
            return results

        return self._run_write("spend", unit)

    @staticmethod
    def _spend_one(
        txid: bytes,
        plan: list[tuple[int, bytes, int, bytes | None]],
        parents: dict[bytes, Parent],
        block_height: int,
        missing_ok: bool = False,
    ) -> list[Spend] | UtxoError:
        spends: list[Spend] = []
        # (parent, slots buffer, offset, page, spending data, vin, vout) of each new spend
        fresh: list[tuple[Parent, bytearray, int, PageRow | None, bytes, int, int]] = []
        errors: list[tuple[int, UtxoError]] = []
        for vin, ptxid, vout, expected in plan:
            p = parents.get(ptxid)
            if p is None and missing_ok:
                continue
            mine = txid + vin.to_bytes(4, "little")
            loc = None if p is None else p.locate(vout)
            if loc is not None and loc[2] is not None and loc[2].creating:
                # A child page still being created (its master's flag normally says so first).
                errors.append((vin, TxCreating(f"tx {hash_to_hex(ptxid)} is still being created",
                                               outpoint=(ptxid, vout))))
                continue
            if p is not None and loc is not None and p.plain(block_height):
                buf, off, page = loc
                h = bytes(buf[off : off + 32])
                if h != NO_HASH and (expected is None or expected == h):
                    sp = buf[off + 32 : off + SLOT]
                    if sp == UNSPENT:  # the common case: decided without the full rule walk
                        spends.append(Spend(ptxid, vout, h, txid, vin))
                        fresh.append((p, buf, off, page, mine, vin, vout))
                        continue
                    if sp == mine:
                        spends.append(Spend(ptxid, vout, h, txid, vin))
                        continue
            out = None if p is None else p.output(vout)
            err = check_spend(
                (ptxid, vout),
                expected,
                (txid, vin),
                block_height,
                None if p is None else p.check,
                out,
            )
            if err is not None:
                errors.append((vin, err))
            else:
                assert out is not None and p is not None and loc is not None
                spends.append(Spend(ptxid, vout, out[0], txid, vin))
                if out[1] is None:
                    fresh.append((p, loc[0], loc[1], loc[2], mine, vin, vout))
        seen: dict[tuple[int, int], int] = {}
        for p, _buf, _off, _page, _mine, vin, vout in fresh:
            first = seen.setdefault((p.id, vout), vin)
            if first != vin:
                op = (next(s.txid for s in spends if s.spending_vin == vin), vout)
                errors.append(
                    (
                        vin,
                        UtxoSpent(
                            f"output {fmt_outpoint(op)} is spent twice by the same tx "
                            f"(inputs {first} and {vin})",
                            outpoint=op,
                            spending_txid=txid,
                            spending_vin=first,
                        ),
                    )
                )
        if errors:
            return SpendRejected(txid, sorted(errors, key=lambda e: e[0]))
        for p, buf, off, page, mine, _vin, _vout in fresh:
            buf[off + 32 : off + SLOT] = mine
            p.mark(page, 1)
        return spends

    def unspend(self, spends: Sequence[Spend]) -> list[bool]:
        validate.outpoints((s.txid, s.vout) for s in spends)
        for s in spends:
            validate.hash32("spending_txid", s.spending_txid)
            validate.number("spending_vin", s.spending_vin, validate.MAX_VOUT)
        height = self._height()

        def unit(cur: Any) -> list[bool]:
            parents = self._lock_parents(cur, {s.txid for s in spends}, ((s.txid, s.vout) for s in spends))
            cleared: list[bool] = []
            for s in spends:
                p = parents.get(s.txid)
                loc = None if p is None else p.locate(s.vout)
                if p is None or loc is None:
                    cleared.append(False)
                    continue
                buf, off, page = loc
                if buf[off + 32 : off + SLOT] != slots.spending_data(s.spending_txid, s.spending_vin):
                    cleared.append(False)
                    continue
                buf[off + 32 : off + SLOT] = UNSPENT
                p.mark(page, -1)
                cleared.append(True)
            self._write_parents(cur, parents, height)
            return cleared

        return self._run_write("unspend", unit)

    def _write_parents(self, cur: Any, parents: dict[bytes, Parent], height: int) -> None:
        rows = []
        for p in parents.values():
            if p.changed:
                p.dah = p.new_dah(height, self.retention)
                rows.append(
                    (
                        bytes(p.utxos),
                        p.spent,
                        p.dah,
                        json.dumps(p.spendable) if p.spendable else "{}",
                        p.reassignments,
                        p.id,
                    )
                )
        if rows:
            cur.executemany(self._q(SET_OUTPUT_STATE), rows)
            self._write_pages_of(cur, parents.values())

    # -- freeze / unfreeze / reassign --------------------------------------------------------------
    def _per_output(
        self,
        what: str,
        items: Sequence[tuple[Outpoint, bytes]],
        act: Callable[[Outpoint, Parent, Loc, tuple[Any, ...]], UtxoError | None],
    ) -> list[UtxoError | None]:
        validate.outpoints(op for op, _h in items)
        for _op, h in items:
            validate.hash32("utxo_hash", h)
        height = self._height()

        def unit(cur: Any) -> list[UtxoError | None]:
            parents = self._lock_parents(cur, {op[0] for op, _h in items}, (op for op, _h in items))
            result: list[UtxoError | None] = []
            for op, h in items:
                p = parents.get(op[0])
                out = None if p is None else p.output(op[1])
                if p is None:
                    result.append(TxNotFound(f"tx of {fmt_outpoint(op)} not found", outpoint=op))
                elif p.row[2]:  # its creation is unfinished: its outputs are not settled yet
                    result.append(TxCreating(f"tx of {fmt_outpoint(op)} is still being created", outpoint=op))
                elif out is None:
                    result.append(UtxoNotFound(f"output {fmt_outpoint(op)} does not exist", outpoint=op))
                elif out[0] != h:
                    result.append(
                        UtxoMismatch(
                            f"output {fmt_outpoint(op)}: utxo hash {hash_to_hex(h)} does not match",
                            outpoint=op,
                        )
                    )
                else:
                    loc = p.locate(op[1])
                    assert loc is not None  # `output` found the slot
                    result.append(act(op, p, loc, out))
            self._write_parents(cur, parents, height)
            return result

        return self._run_write(what, unit)

    def freeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        def act(op: Outpoint, p: Parent, loc: Loc, out: tuple[Any, ...]) -> UtxoError | None:
            buf, off, page = loc
            if out[3]:
                return None
            if out[1] is not None:
                return UtxoSpent(
                    f"output {fmt_outpoint(op)} is spent by {hash_to_hex(out[1])}:{out[2]}; "
                    "only an unspent output can be frozen",
                    outpoint=op,
                    spending_txid=out[1],
                    spending_vin=out[2],
                )
            buf[off + 32 : off + SLOT] = slots.FROZEN
            p.mark(page)
            return None

        return self._per_output("freeze", items, act)

    def unfreeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        def act(op: Outpoint, p: Parent, loc: Loc, out: tuple[Any, ...]) -> UtxoError | None:
            buf, off, page = loc
            if not out[3]:
                return ProcessingError(f"output {fmt_outpoint(op)} is not frozen", outpoint=op)
            buf[off + 32 : off + SLOT] = UNSPENT
            p.mark(page)
            return None

        return self._per_output("unfreeze", items, act)

    def reassign(self, outpoint: Outpoint, utxo_hash: bytes, new_utxo_hash: bytes) -> None:
        validate.hash32("new_utxo_hash", new_utxo_hash)
        if new_utxo_hash == NO_HASH:
            raise ProcessingError("new_utxo_hash must not be all zero (that marks an empty slot)")
        height = self._height()
        if height <= 0:
            raise ProcessingError("reassign needs the current block height (set_block_height)")

        def act(op: Outpoint, p: Parent, loc: Loc, out: tuple[Any, ...]) -> UtxoError | None:
            buf, off, page = loc
            if not out[3]:
                return ProcessingError(
                    f"output {fmt_outpoint(op)} must be frozen before it is reassigned", outpoint=op
                )
            buf[off : off + SLOT] = new_utxo_hash + UNSPENT
            p.spendable[str(op[1])] = height + REASSIGN_DELAY
            entries = json.loads(p.reassignments)
            entries.append(
                {
                    "offset": op[1],
                    "utxo_hash": hash_to_hex(utxo_hash),
                    "new_utxo_hash": hash_to_hex(new_utxo_hash),
                    "block_height": height,
                }
            )
            p.reassignments = json.dumps(entries)
            p.mark(page)
            return None

        (err,) = self._per_output("reassign", [(outpoint, utxo_hash)], act)
        if err is not None:
            raise err
