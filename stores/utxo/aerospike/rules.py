"""The Python half of the Lua port: each kernel rule as one call of `utxoflow.lua` per record,
and the codes it returns turned into the kernel's own verdicts (`kernel.verdicts`).

Invariants:
- A record's rule runs inside the server under the record's lock (a UDF), so per record it is
  atomic; nothing here reads a record to decide a rule, but for whether a child page's master
  is still creating (`_creating`: the kernel asks the master first, and pages clear first).
- A transaction's spend is all or nothing across its parents' records: each parent's inputs
  are spent in one call, and when any parent refuses, the inputs newly spent on the others are
  taken back (`take_back`, which reverts a slot only while it still holds this spender's data).
- A block's spend call (`by_block`) puts a token of its own on each slot it spends or finds
  its transaction's (`blockSpent`, see the Lua module), and a take-back reverts a slot only
  while it holds no token or the taking call's own (an unspend reverts it whatever it holds).
  A refused call's take-back may land after another call spent for the same transaction
  (there is no transaction across records): a refused delivery after a block's spend, or a
  block's spend unit run twice (a holder that lapsed but lived on) after the run that went
  through. Neither can free an input that the later block call relies on. A refused block
  call leaves its token on the slots it found (it takes back only what it spent) until the
  block spends that transaction again or its rollback releases it.
- A process that dies between spend and take-back leaves the spends it made, and an attempt
  delivered again finds them its own (not new), so its own take-back, if it is refused, does
  not revert them. The refused delivery then frees the slots still holding the transaction's
  spend while it has no record (`take_back_input`, never a slot a block's call marked), and
  looks for the record again after: a delivery beside it that spent everything meanwhile (a
  rival's brief hold ended) and made the record gets its inputs held again or is made
  conflicting (`workers.chainstate.mempool`). A block that needs one first takes it over
  (`workers.chainstate.conflicts.take_over`). One delivery of a txid at a time (a lease around spend and
  create) was tried and reverted for its own races (a put-back after a refused block's
  rollback, a holder outliving its lease); the block tokens above are the part of it that hold
  on their own.
- A child page's master takes the page's spent count after every call that ran on the page
  (`page_spent`, idempotent by the page's revision), so a report lost with a dying process is
  made by the next call there.
- Output `vout` lives in record (txid, vout // batch_size); its slot is vout % batch_size.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from chain import Tx
from stores.utxo.aerospike.client import Connection, Key
from stores.utxo.errors import Outpoint, ProcessingError, SpendRejected, UtxoError
from stores.utxo.kernel import verdicts
from stores.utxo.kernel.spend import NO_IGNORE, Ignore, expected_hash
from stores.utxo.values import Spend, SpendInfo, SpendStatus

Ctx = str  # "spend", "unspend", "verify" (freeze / unfreeze / reassign), "freeze"
REDONE = ("UTXO_HASH_MISMATCH", "UTXO_NOT_FROZEN")  # what a reassign done already answers again


def mine(txid: bytes, vin: int) -> bytes:
    """The spending data input `vin` of `txid` writes."""
    return txid + vin.to_bytes(4, "little")


# A spend's item as the Lua `spend` reads it: slot, vout, vin, whether a UTXO hash is expected,
# that hash (zero when not); a call's items go as one bytes value (see `spend` in the module).
_ITEM = struct.Struct("<IIIB32s")
_NO_HASH = bytes(32)


def packed(items: Sequence[tuple[int, int, Outpoint, bytes | None]]) -> bytes:
    """`_groups`' items of one record, (vin, slot, outpoint, hash expected or None), packed."""
    pack = _ITEM.pack
    return b"".join(pack(s, op[1], v, w is not None, w or _NO_HASH) for v, s, op, w in items)


# A successful spend's answer, as the Lua module packs it (its SPENT_FORMAT): delete-at-height
# before and after (-1: none), spent, rev, how many items were newly spent; then those items'
# indexes (LE u32 each), then every item's UTXO hash
_SPENT = struct.Struct("<qqqqI")


def spend_result(res: Any) -> Mapping[str, Any]:
    """A spend call's answer as a map: a refusal is one already; a success, packed, becomes
    {dah_was, dah, spent, gen, fresh, hashes: the items' UTXO hashes in item order} (None for
    no delete-at-height)."""
    if not isinstance(res, (bytes, bytearray)):
        return res  # type: ignore[no-any-return]
    b = bytes(res)
    was, dah, spent, gen, n = _SPENT.unpack_from(b)
    at = _SPENT.size + 4 * n
    return {
        "dah_was": None if was < 0 else was, "dah": None if dah < 0 else dah, "spent": spent, "gen": gen,
        "fresh": list(struct.unpack_from(f"<{n}I", b, _SPENT.size)),
        "hashes": [b[i : i + 32] for i in range(at, len(b), 32)],
    }  # fmt: skip


def mined_result(res: Any) -> Mapping[str, Any]:
    """A set-mined call's answer as a map: a refusal is one already; a success, packed (the
    record's child page count, LE u32, then its block ids, LE i64 each), becomes {extra,
    blocks}."""
    if not isinstance(res, (bytes, bytearray)):
        return res  # type: ignore[no-any-return]
    extra, *blocks = struct.unpack(f"<I{(len(res) - 4) // 8}q", res)
    return {"extra": extra, "blocks": blocks}


def verdict(
    res: Mapping[str, Any],
    op: Outpoint,
    ctx: Ctx,
    *,
    want: bytes | None = None,
    spender: bytes = b"",
    vin: int = 0,
    height: int = 0,
) -> UtxoError:
    """The kernel's error for a code the Lua module returned about output `op`."""
    code = res["code"]
    if code == "TX_NOT_FOUND":
        return verdicts.tx_not_found(op, parent=ctx == "spend")
    if code == "TX_CREATING":
        return verdicts.tx_creating(op, parent=ctx == "spend")
    if code == "TX_CONFLICTING":
        return verdicts.tx_conflicting(op)
    if code == "TX_LOCKED":
        return verdicts.tx_locked(op)
    if code == "TX_COINBASE_IMMATURE":
        return verdicts.coinbase_immature(op, res["spendable_at"], height)
    if code == "UTXO_NOT_FOUND":
        return verdicts.utxo_not_found(op)
    if code == "UTXO_HASH_MISMATCH":
        assert want is not None
        stored = bytes(res["stored"]) if ctx == "spend" else None
        return verdicts.mismatch(op, want, stored, spend=ctx == "spend")
    if code == "UTXO_FROZEN":
        if "until" in res:
            return verdicts.reassigned(op, res["until"] - 1)
        return verdicts.frozen(op, unspend=ctx == "unspend")
    if code == "INVALID_SPEND":
        return verdicts.invalid_spend(op, spender)
    if code == "UTXO_SPENT":
        return verdicts.spent(op, bytes(res["spending_txid"]), res["spending_vin"], freeze=ctx == "freeze")
    if code == "SPENT_TWICE":
        return verdicts.spent_twice(op, spender, res["first"], vin)
    if code == "UTXO_ALREADY_FROZEN":
        return verdicts.already_frozen(op)
    if code == "UTXO_NOT_FROZEN":
        return verdicts.not_frozen(op)
    return ProcessingError(
        f"the store's rules returned an unknown code {code!r} for output {op}", outpoint=op
    )


class Rules:
    """The kernel's rules on one Aerospike namespace and set."""

    def __init__(self, conn: Connection, batch_size: int, retention: int) -> None:
        self.conn = conn
        self.batch_size = batch_size
        self.retention = retention

    def where(self, op: Outpoint) -> tuple[Key, int]:
        """(the key of the record holding output `op`, its slot there)."""
        page, slot = divmod(op[1], self.batch_size)
        return self.conn.key(op[0], page), slot

    def _creating(self, parents: Collection[bytes]) -> set[bytes]:
        """Those of `parents` whose master is still `creating`. A child page's own flag clears
        before its master's (children first), so a spend or an alert on a page asks the master
        too: the kernel's rules speak of the master first."""
        if not parents:
            return set()
        wanted = list(parents)
        found = self.conn.read_bins([self.conn.key(t) for t in wanted], ["creating"])
        return {t for t, b in zip(wanted, found) if b is not None and b.get("creating") == 1}

    def _report(self, key: Key, res: Mapping[str, Any], dah_height: int) -> None:
        """After a change of a child page's slots: its master takes the page's spent count (for
        the whole transaction's, and its delete-at-height)."""
        if len(key[2]) > 32 and "gen" in res:
            page = int.from_bytes(key[2][32:], "little")
            self.conn.apply(
                self.conn.key(key[2][:32]),
                "page_spent",
                [page, res["gen"], res["spent"], dah_height, self.retention],
            )

    def _call(self, op: Outpoint, function: str, args: Any, missing: Any) -> tuple[Key, Any]:
        """`function` on the record of `op`'s output, with `args(slot)`. A child page that does
        not exist sends the call to the master with a slot past its end, so that the master's
        record-level rules speak first and the output is then not found (`missing(result)`
        tells a missing record). (the key it ran on, its result)"""
        key, slot = self.where(op)
        res = self.conn.apply(key, function, args(slot))
        if slot != op[1] and missing(res):
            key = self.conn.key(op[0])
            res = self.conn.apply(key, function, args(op[1]))
        return key, res

    # -- spends -----------------------------------------------------------------------------
    def spend_txs(
        self,
        txs: Sequence[Tx],
        height: int,
        dah_height: int,
        ignore: Ignore = NO_IGNORE,
        skip_missing: Collection[bytes] = (),
        vouch: Callable[[list[bytes]], Collection[bytes]] | None = None,
        by_block: bool = False,
    ) -> list[list[Spend] | UtxoError]:
        """`spend_tx` of each of `txs` in turn (a coinbase spends nothing), as the kernel orders
        them. The transactions that share no outpoint with another of the call go in one batch
        of calls (their order cannot matter): each whose calls all succeed keeps its spends;
        each other has its new spends taken back and goes again alone, for its exact errors.
        Those that share an outpoint go one at a time, in order, after: the first one wins, and
        a refused one frees what it took for the later ones. `skip_missing`: the txids whose
        inputs with a missing parent are left out; and, when given, those `vouch` names among
        the ones that go alone (asked only when there are such: a parent gone is rare, and a
        transaction of the batch that met one is among them, its new spends taken back).
        `by_block`: the spends are a block's call, with a token of their own (see the
        invariants)."""
        out: list[list[Spend] | UtxoError] = [[] for _ in txs]
        seen: dict[Outpoint, int] = {}
        shared: set[int] = set()
        for k, tx in enumerate(txs):
            if tx.is_coinbase:
                continue
            for i in tx.inputs:
                first = seen.setdefault((i.prev_txid, i.prev_vout), k)
                if first != k:
                    shared.update((first, k))
        alone = [k for k, tx in enumerate(txs) if not tx.is_coinbase and k not in shared]
        token = secrets.randbelow(2**32 - 1) + 1 if by_block else 0
        again = self._batch(txs, alone, out, height, dah_height, ignore, skip_missing, token)
        later = sorted({*again, *shared})
        if later and vouch is not None:
            skip_missing = {*skip_missing, *vouch([txs[k].txid for k in later])}
        for k in later:
            out[k] = self.spend_tx(txs[k], height, dah_height, ignore, txs[k].txid in skip_missing, token)
        return out

    def _batch(
        self,
        txs: Sequence[Tx],
        which: Sequence[int],
        out: list[list[Spend] | UtxoError],
        height: int,
        dah_height: int,
        ignore: Ignore,
        skip_missing: Collection[bytes],
        token: int,
    ) -> list[int]:
        """The spends of `txs[which]` in one batch of calls, into `out`; the indexes of those
        that did not go through whole (their new spends taken back already)."""
        common = [
            height, int(ignore.conflicting), int(ignore.locked), dah_height, self.retention, token
        ]
        calls: list[tuple[Key, str, list[Any]]] = []
        owners: list[tuple[int, list[tuple[int, int, Outpoint, bytes | None]]]] = []
        for k in which:
            for (parent, page), items in self._groups(txs[k]).items():
                args = [packed(items), txs[k].txid, *common]
                calls.append((self.conn.key(parent, page), "spend", args))
                owners.append((k, items))
        results = [spend_result(r) for r in self.conn.apply_many(calls)]
        creating = self._creating({bytes(key[2][:32]) for key, _f, _a in calls if len(key[2]) > 32})
        failed: set[int] = set()
        for r, (key, _f, _a), (k, _items) in zip(results, calls, owners):
            if "fresh" in r:
                if len(key[2]) > 32 and bytes(key[2][:32]) in creating:
                    failed.add(k)  # a page whose master is still creating: see `_creating`
                continue
            gone = r.get("code") == "TX_NOT_FOUND" and len(key[2]) == 32 and txs[k].txid in skip_missing
            if not gone:  # (a missing parent that may be skipped is no failure)
                failed.add(k)
        undo = []
        for r, (key, _f, _a), (k, items) in zip(results, calls, owners):
            if "fresh" not in r:
                continue
            if k in failed:
                if r["fresh"]:
                    spent = [[items[i][1], mine(txs[k].txid, items[i][0])] for i in r["fresh"]]
                    args = [spent, r.get("dah_was"), r.get("dah"), dah_height, self.retention, r.get("gen"),
                            token]
                    undo.append((key, "take_back", args))
                continue
            spends = out[k]
            assert isinstance(spends, list)
            spends += [Spend(op[0], op[1], h, txs[k].txid, vin)
                       for (vin, _s, op, _w), h in zip(items, r["hashes"])]  # fmt: skip
            self._report(key, r, dah_height)
        for k in which:
            spends = out[k]
            if k not in failed and isinstance(spends, list):
                spends.sort(key=lambda s: s.spending_vin)
        for (key, _f, _a), r in zip(undo, self.conn.apply_many(undo)):
            self._report(key, r, dah_height)
        return sorted(failed)

    def _groups(self, tx: Tx) -> dict[tuple[bytes, int], list[tuple[int, int, Outpoint, bytes | None]]]:
        """`tx`'s inputs by the record that holds what they spend: (parent, page) → [(vin, slot,
        outpoint, the UTXO hash expected or None)]."""
        groups: dict[tuple[bytes, int], list[tuple[int, int, Outpoint, bytes | None]]] = {}
        size = self.batch_size
        for vin, i in enumerate(tx.inputs):
            op = (i.prev_txid, i.prev_vout)
            page, slot = divmod(op[1], size)
            groups.setdefault((op[0], page), []).append((vin, slot, op, expected_hash(tx, vin)))
        return groups

    def spend_tx(
        self,
        tx: Tx,
        height: int,
        dah_height: int,
        ignore: Ignore = NO_IGNORE,
        skip_missing: bool = False,
        token: int = 0,
    ) -> list[Spend] | SpendRejected:
        """`kernel.spend.spend_tx` over the records of `tx`'s parents (see the invariants);
        `token`: a block call's (0: none)."""
        txid = tx.txid
        groups = self._groups(tx)
        spends: list[Spend] = []
        errors: list[tuple[int, UtxoError]] = []
        done: list[tuple[Key, list[Any]]] = []
        ign = [int(ignore.conflicting), int(ignore.locked)]
        common = [txid, height, *ign, dah_height, self.retention, token]
        creating = self._creating({parent for parent, page in groups if page})
        for (parent, page), items in groups.items():
            if page and parent in creating:
                errors += [(vin, verdicts.tx_creating(op, parent=True)) for vin, _s, op, _w in items]
                continue
            key = self.conn.key(parent, page)
            res = spend_result(self.conn.apply(key, "spend", [packed(items), *common]))
            if res.get("code") == "TX_NOT_FOUND" and len(key[2]) > 32:  # no such page: see `_call`
                items = [(v, op[1], op, w) for v, _s, op, w in items]
                key = self.conn.key(key[2][:32])
                res = spend_result(self.conn.apply(key, "spend", [packed(items), *common]))
            if "code" in res:  # the record refused every input on it
                if res["code"] == "TX_NOT_FOUND" and skip_missing:
                    continue
                errors += [
                    (vin, verdict(res, op, "spend", want=want, spender=txid, vin=vin, height=height))
                    for vin, _slot, op, want in items
                ]
                continue
            if "errors" in res:
                for k, e in res["errors"]:
                    vin, _slot, op, want = items[k]
                    errors.append(
                        (vin, verdict(e, op, "spend", want=want, spender=txid, vin=vin, height=height))
                    )
                continue
            for (vin, _slot, op, _want), h in zip(items, res["hashes"]):
                spends.append(Spend(op[0], op[1], h, txid, vin))
            fresh = res["fresh"]
            if fresh:
                undo = [[items[k][1], mine(txid, items[k][0])] for k in fresh]
                was, dah, gen = res.get("dah_was"), res.get("dah"), res.get("gen")
                done.append((key, [undo, was, dah, dah_height, self.retention, gen, token]))
            self._report(key, res, dah_height)
        if errors:
            for key, args in done:
                self._report(key, self.conn.apply(key, "take_back", args), dah_height)
            return SpendRejected(txid, sorted(errors, key=lambda e: e[0]))
        spends.sort(key=lambda s: s.spending_vin)
        return spends

    def unspend(self, op: Outpoint, want: bytes, dah_height: int) -> UtxoError | None:
        key, res = self._call(
            op,
            "unspend",
            lambda slot: [[[slot, want]], dah_height, self.retention],
            lambda r: r["results"][0] != 0 and r["results"][0]["code"] == "TX_NOT_FOUND",
        )
        out = res["results"][0]
        self._report(key, res, dah_height)
        return None if out == 0 else verdict(out, op, "unspend", want=want)

    def take_back_input(self, op: Outpoint, spender: bytes, vin: int, dah_height: int, own: int = 0) -> bool:
        """`kernel.spend.take_back` of one input: `op` freed only while it holds input `vin` of
        `spender` and no block's token (`own` -1: whatever token), the delete-at-height
        settled again by the rule."""
        key, res = self._call(
            op, "take_back",
            lambda slot: [[[slot, mine(spender, vin)]], None, None, dah_height, self.retention, -1, own],
            lambda r: r.get("code") == "TX_NOT_FOUND",
        )
        if "code" in res:
            return False
        self._report(key, res, dah_height)
        return bool(res["n"])

    def get_spend(self, op: Outpoint, want: bytes, tip: int) -> SpendInfo:
        if op[1] >= self.batch_size and self._creating([op[0]]):
            return SpendInfo(SpendStatus.LOCKED)
        _key, res = self._call(
            op, "get_spend", lambda slot: [slot, op[1], want, tip], lambda r: r["status"] == "NOT_FOUND"
        )
        status = res["status"]
        if status == "MISMATCH":
            raise verdicts.mismatch(op, want, bytes(res["stored"]))
        if status == "SPENT":
            return SpendInfo(SpendStatus.SPENT, bytes(res["spending_txid"]), res["spending_vin"])
        if status == "FROZEN":
            return SpendInfo(SpendStatus.FROZEN, b"\xff" * 32, op[1])
        if status == "IMMATURE":
            return SpendInfo(SpendStatus.IMMATURE, until=res["until"])
        return SpendInfo(SpendStatus[status])

    # -- the alert system ---------------------------------------------------------------------
    def alert(
        self,
        what: str,
        op: Outpoint,
        want: bytes,
        new_hash: bytes | None = None,
        tip: int = 0,
        delay: int = 0,
    ) -> UtxoError | None:
        """freeze / unfreeze / reassign one output (`kernel.outputs`)."""
        if op[1] >= self.batch_size and self._creating([op[0]]):
            return verdicts.tx_creating(op)
        key, res = self._call(
            op,
            "alert",
            lambda slot: [what, slot, op[1], want, new_hash, tip, delay],
            lambda r: r != 0 and r["code"] == "TX_NOT_FOUND",
        )
        paged = what == "reassign" and len(key[2]) > 32
        if res != 0:
            if paged and res["code"] in REDONE and self._holds(key, op, new_hash):
                # an earlier attempt reassigned the page and may have died before noting it on
                # the master: note it now (once), and answer as the kernel does a second reassign
                self._note(op, want, new_hash, tip, delay)
            return verdict(res, op, "freeze" if what == "freeze" else "verify", want=want)
        if paged:  # the master keeps the log and the whole transaction's count
            self._note(op, want, new_hash, tip, delay)
        return None

    def _note(self, op: Outpoint, want: bytes, new_hash: bytes | None, tip: int, delay: int) -> None:
        self.conn.apply(self.conn.key(op[0]), "note_reassign", [op[1], want, new_hash, tip, delay])

    def _holds(self, key: Key, op: Outpoint, new_hash: bytes | None) -> bool:
        """Whether the page at `key` holds `new_hash` as the UTXO hash of output `op`."""
        (bins,) = self.conn.read_bins([key], ["utxos"])
        off = (op[1] % self.batch_size) * 68
        return bins is not None and new_hash is not None and bytes(bins["utxos"][off : off + 32]) == new_hash

    # -- record state ---------------------------------------------------------------------------
    def set_mined(
        self, txid: bytes, block: tuple[int, int, int], on_longest: bool, unset: bool, height: int
    ) -> list[int] | None:
        """The record's block ids after the change; None: no such record."""
        res = mined_result(self.conn.apply(
            self.conn.key(txid),
            "set_mined",
            [block[0], block[1], block[2], int(on_longest), int(unset), height, self.retention, 1],
        ))  # fmt: skip
        return None if "code" in res else list(res["blocks"])

    def set_state(self, txid: bytes, what: str, value: int, height: int) -> bool:
        """longest / locked / conflicting / preserve / expire (see the Lua module); False: no
        such record."""
        res = self.conn.apply(self.conn.key(txid), "set_state", [what, value, height, self.retention])
        return res == 0

    def add_child(self, txid: bytes, which: str, child: bytes) -> bool | None:
        """List `child` on `which` ("conflicting" or "deleted"); None: no such record."""
        res = self.conn.apply(self.conn.key(txid), "add_child", [which, child])
        return None if isinstance(res, dict) else res == 1
