"""The record kernel's fast forms held to the rules they are the fast forms of, on generated
record states (Hypothesis): the spend fast path against the full walk, and the SQL form of the
first-mining delete-at-height against `kernel.marks.set_mined`. No store: the kernel alone."""

from __future__ import annotations

import copy
import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain import Tx, TxIn
from chain.build import build_tx, p2pkh
from stores.utxo import slots
from stores.utxo.kernel import create, dah, marks, spend
from stores.utxo.kernel.record import Record

BATCH = 4
RET = 10
PARENTS = 2
SCRIPTS = [p2pkh(bytes([k]) * 20) for k in range(3)]


def parent_tx(k: int) -> Tx:
    return build_tx([TxIn(bytes([0xA0 + k]) * 32, 0, b"\x51", 0xFFFFFFFF)],
                    [(1000 + v, SCRIPTS[v % 3]) for v in range(3)])


PARENT_TXS = [parent_tx(k) for k in range(PARENTS)]
SPENDER = b"\x5e" * 32


@st.composite
def parents(draw: st.DrawFn) -> dict[bytes, Record]:
    """Records of PARENT_TXS in random states: flags, coinbase maturity, reassigned outputs,
    pruned children, and each slot unspent, spent (by a stranger or by the spender that will
    try again), frozen or empty."""
    out = {}
    for k, tx in enumerate(PARENT_TXS):
        if draw(st.booleans()) and k:  # parent 0 always exists
            continue
        packed, n = create.tx_slots(tx)
        rec = Record(tx.txid, bytearray(packed), n, 0, page=0)
        rec.creating = draw(st.sampled_from([False] * 5 + [True]))
        rec.conflicting = draw(st.sampled_from([False] * 4 + [True]))
        rec.locked = draw(st.sampled_from([False] * 4 + [True]))
        rec.is_coinbase = draw(st.booleans())
        rec.spending_height = draw(st.sampled_from([0, 99, 100, 101])) if rec.is_coinbase else 0
        if draw(st.booleans()):
            rec.set_spendable({draw(st.integers(0, 2)): draw(st.sampled_from([99, 100, 101]))})
        if draw(st.sampled_from([False] * 3 + [True])):
            rec.deleted_children = SPENDER
        for v in range(3):
            off = v * slots.SLOT
            what = draw(st.sampled_from(["unspent"] * 4 + ["stranger", "again", "frozen", "empty"]))
            if what == "stranger":
                rec.utxos[off + 32 : off + 68] = b"\x13" * 32 + b"\x00\x00\x00\x00"
            elif what == "again":
                rec.utxos[off + 32 : off + 68] = SPENDER + b"\x00\x00\x00\x00"
            elif what == "frozen":
                rec.utxos[off + 32 : off + 68] = slots.FROZEN
            elif what == "empty":
                rec.utxos[off : off + 68] = slots.EMPTY_SLOT
                rec.total_utxos -= 1
            rec.spent_utxos += what in ("stranger", "again")
        rec.dirty.clear()
        out[tx.txid] = rec
    return out


@st.composite
def spender_txs(draw: st.DrawFn) -> list[Tx]:
    """Up to four transactions spending random outpoints of the parents (or of a tx the store
    never saw, or vouts past the end), with the right previous output, a wrong one, or none."""
    txs = []
    for n in range(draw(st.integers(1, 4))):
        ins = []
        for _ in range(draw(st.integers(1, 3))):
            k = draw(st.integers(0, PARENTS))  # PARENTS: an unknown parent
            txid = PARENT_TXS[k].txid if k < PARENTS else b"\x77" * 32
            vout = draw(st.sampled_from([0, 1, 2, 5]))
            prev = draw(st.sampled_from(["right"] * 4 + ["wrong", "none"]))
            if prev == "none" or k == PARENTS or vout > 2:
                ins.append(TxIn(txid, vout, b"\x51", 0xFFFFFFFF))
            else:
                o = PARENT_TXS[k].outputs[vout]
                script = o.script if prev == "right" else SCRIPTS[(vout + 1) % 3]
                ins.append(TxIn(txid, vout, b"\x51", 0xFFFFFFFF, o.satoshis, script))
        tx = build_tx(ins, [(500, SCRIPTS[n % 3])])
        txs.append(tx)
    return txs


def outcome(results: list[object]) -> list[object]:
    return [
        [tuple(s) for s in r] if isinstance(r, list) else
        (r.code, [(vin, e.code, str(e)) for vin, e in getattr(r, "errors", [])])  # type: ignore[attr-defined]
        for r in results
    ]


def snapshot(recs: dict[bytes, Record]) -> dict[bytes, tuple[bytes, int, frozenset[str]]]:
    touched = {"utxos", "spent_utxos"}
    return {t: (bytes(r.utxos), r.spent_utxos, frozenset(r.dirty) & touched) for t, r in recs.items()}


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parents(), spender_txs(), st.sampled_from([99, 100, 101]), st.booleans())
def test_the_spend_fast_path_is_the_rule(
    recs: dict[bytes, Record], txs: list[Tx], height: int, missing_ok: bool
) -> None:
    """`spend_txs` decides every spend exactly as the full rule walk (`fast=False`) does: the
    same results, errors and slot changes, on any record state."""
    fast, slow = copy.deepcopy(recs), copy.deepcopy(recs)
    got = spend.spend_txs(txs, fast, height, BATCH, missing_ok=missing_ok)
    want = spend.spend_txs(txs, slow, height, BATCH, missing_ok=missing_ok, fast=False)
    assert outcome(got) == outcome(want)
    assert snapshot(fast) == snapshot(slow)


@settings(max_examples=300, deadline=None)
@given(
    conflicting=st.booleans(), preserve=st.sampled_from([None, 500]), total=st.integers(0, 3),
    spent=st.integers(0, 3), dah_was=st.sampled_from([None, 50, 105, 200]),
    height=st.sampled_from([90, 100, 150]), retention=st.sampled_from([0, RET]),
)
def test_the_first_mining_sql_is_the_rule(
    conflicting: bool, preserve: int | None, total: int, spent: int, dah_was: int | None, height: int,
    retention: int,
) -> None:
    """`dah.first_mining_sql`, evaluated by SQLite on a row, gives the DAH `marks.set_mined`
    gives the same record mined for the first time on the longest chain."""
    spent = min(spent, total)
    rec = Record(b"\x01" * 32, bytearray(), total, spent, conflicting=conflicting, preserve_until=preserve,
                 delete_at_height=dah_was, unmined_since=80)
    marks.set_mined(rec, (1, height, 0), True, height, retention)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE txs (conflicting, preserve_until, spent_utxos, total_utxos, delete_at_height)")
    db.execute("INSERT INTO txs VALUES (?, ?, ?, ?, ?)", (int(conflicting), preserve, spent, total, dah_was))
    (got,) = db.execute(f"SELECT {dah.first_mining_sql(height, retention)} FROM txs").fetchone()
    assert got == rec.delete_at_height


def test_a_child_is_listed_once_and_only_a_whole_entry_counts_as_listed() -> None:
    rec = Record(b"\x01" * 32, bytearray(), 1, 1)
    a, b = bytes(range(32)), bytes(range(32, 64))
    assert rec.add_child("deleted_children", a) and rec.add_child("deleted_children", b)
    assert not rec.add_child("deleted_children", a) and not rec.add_child("deleted_children", b)
    across = a[16:] + b[:16]  # bytes of the list that straddle two entries: not an entry
    assert rec.add_child("deleted_children", across)
    assert rec.children("deleted_children") == [a, b, across]
