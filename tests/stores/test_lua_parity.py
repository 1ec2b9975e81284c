"""The Lua module (`stores/utxo/aerospike/utxoflow.lua`) is the record kernel ported: the same
generated record states and calls go through the Python kernel and through the module on a
real Aerospike server, and the verdicts, the errors' words and every field of the records
after must be the same — and the script index's `liveKeys` the module keeps must be what the
codec makes of the kernel's record after. Needs `AEROSPIKE_HOSTS` (tests/aerospike_server.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain import Tx
from chain.build import build_tx, spend_input
from stores.utxo import slots
from stores.utxo.kernel import create, dah, marks, outputs, spend
from stores.utxo.kernel.record import Record
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.stores.test_kernel import BATCH, PARENT_TXS, SCRIPTS, SPENDER, outcome, parents, spender_txs

pytestmark = needs_aerospike
RET = 10
OTHER = b"\x44" * 32
FIELDS = (
    "utxos", "total_utxos", "spent_utxos", "creating", "locked", "conflicting", "is_coinbase",
    "spending_height", "unmined_since", "blocks", "preserve_until", "delete_at_height",
    "conflicting_children", "deleted_children", "reassignments", "spendable_in",
)  # fmt: skip
CHECKED = (*FIELDS, "live_keys")  # (the last: the map bin, `codec.live_keys` of the kernel's record)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def rules() -> Iterator[Any]:
    from stores.utxo.aerospike.client import Connection
    from stores.utxo.aerospike.rules import Rules

    url = new_url()
    conn = Connection(url)
    yield Rules(conn, BATCH, RET)
    drop_set(conn.client, url)
    conn.close()


@st.composite
def records(draw: st.DrawFn) -> dict[bytes, Record]:
    """`test_kernel.parents` with the rest of the state drawn too: blocks, the longest chain,
    preservation, a delete-at-height, conflicting children."""
    recs = draw(parents())
    by_txid = {tx.txid: tx for tx in PARENT_TXS}
    for rec in recs.values():
        rec.script_keys = create.script_keys(o.script for o in by_txid[rec.txid].outputs)
        # often one spend short of all spent, or all spent: where the delete-at-height turns
        fill = draw(st.sampled_from(["as drawn", "one left", "all"]))
        unspent = [v for v in range(3) if rec.utxos[v * 68 + 32 : v * 68 + 68] == slots.UNSPENT and
                   rec.utxos[v * 68 : v * 68 + 32] != slots.NO_HASH]  # fmt: skip
        for v in unspent[: {"as drawn": 0, "one left": len(unspent) - 1, "all": len(unspent)}[fill]]:
            rec.utxos[v * 68 + 32 : v * 68 + 68] = b"\x13" * 32 + bytes([v, 0, 0, 0])
            rec.spent_utxos += 1
        blocks = draw(st.sampled_from([[], [(7, 100, 0)], [(7, 100, 0), (8, 101, 3)]]))
        rec.set_block_list(blocks)
        rec.unmined_since = draw(st.sampled_from([None, None, 95])) if blocks else 90
        rec.preserve_until = draw(st.sampled_from([None, None, None, 300]))
        rec.delete_at_height = draw(st.sampled_from([None, None, 95, 120]))
        if draw(st.booleans()):
            rec.conflicting_children = b"\x44" * 32
        rec.dirty.clear()
    return recs


def load(rules: Any, recs: dict[bytes, Record]) -> None:
    """Make the server hold exactly `recs` among the parents' records."""
    import aerospike

    from stores.utxo.aerospike.codec import to_bins

    client = rules.conn.client
    for tx in PARENT_TXS:
        key = rules.conn.key(tx.txid)
        if tx.txid in recs:
            client.put(
                key, to_bins(recs[tx.txid]), policy={"exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE}
            )
        else:
            client.remove(key) if client.exists(key)[1] is not None else None


def stored(rules: Any) -> dict[bytes, dict[str, Any]]:
    from stores.utxo.aerospike.codec import from_bins

    out = {}
    for tx in PARENT_TXS:
        _k, meta, bins = (
            rules.conn.client.get(rules.conn.key(tx.txid))
            if rules.conn.client.exists(rules.conn.key(tx.txid))[1]
            else (None, None, None)
        )
        if meta is not None:
            out[tx.txid] = {**fields(from_bins(bins)), "live_keys": dict(bins.get("liveKeys") or {})}
    return out


def fields(rec: Record) -> dict[str, Any]:
    return {f: bytes(v) if isinstance(v, bytearray) else v for f in FIELDS if (v := getattr(rec, f)) or True}


def kernel_state(recs: dict[bytes, Record]) -> dict[bytes, dict[str, Any]]:
    from stores.utxo.aerospike.codec import live_keys

    return {t: {**fields(r), "live_keys": live_keys(r)} for t, r in recs.items()}


def assert_same(got: dict[bytes, dict[str, Any]], want: dict[bytes, dict[str, Any]]) -> None:
    assert got.keys() == want.keys()
    diff = {
        (t.hex()[:8], f): (got[t][f], want[t][f]) for t in want for f in CHECKED if got[t][f] != want[t][f]
    }
    assert not diff, f"(lua, kernel) differ: {diff}"


def errors(results: list[Any]) -> list[Any]:
    return [None if r is None else (r.code, str(r), getattr(r, "until", None)) for r in results]


def spenders_of_unspent(recs: dict[bytes, Record]) -> st.SearchStrategy[list[Tx]]:
    """One or two transactions spending outputs the records hold unspent, with the right
    previous outputs: spends that go through (the delete-at-height turns on them)."""
    ops = [
        (t, v)
        for t, r in recs.items()
        for v in range(3)
        if r.utxos[v * 68 + 32 : v * 68 + 68] == slots.UNSPENT
        and r.utxos[v * 68 : v * 68 + 32] != slots.NO_HASH
    ]
    by_txid = {tx.txid: tx for tx in PARENT_TXS}
    if not ops:
        return spender_txs()
    picks = st.lists(st.sampled_from(ops), min_size=1, max_size=3, unique=True)
    return st.lists(
        picks.map(
            lambda chosen: build_tx([spend_input(by_txid[t], v) for t, v in chosen], [(500, SCRIPTS[0])])
        ),
        min_size=1,
        max_size=2,
    )


@SETTINGS
@given(records(), st.data(), st.sampled_from([99, 100, 101]), st.booleans(), st.booleans(), st.booleans())
def test_spends_agree(
    rules: Any,
    recs: dict[bytes, Record],
    data: st.DataObject,
    height: int,
    missing_ok: bool,
    ign_c: bool,
    ign_l: bool,
) -> None:
    """Each transaction's spend: the same spends or the same rejection, input by input, and the
    same records after (slots, counts, delete-at-height)."""
    txs = data.draw(st.one_of(spender_txs(), spenders_of_unspent(recs)))
    load(rules, recs)
    ignore = spend.Ignore(conflicting=ign_c, locked=ign_l)
    py = copy.deepcopy(recs)
    dah_height = height + 3
    want = []
    for tx in txs:
        want += spend.spend_txs([tx], py, height, BATCH, ignore=ignore, missing_ok=missing_ok, fast=False)
        for rec in py.values():
            if "spent_utxos" in rec.dirty:
                dah.apply_dah(rec, dah_height, RET)
            rec.dirty.clear()
    # all of them in one call: the batch, or (when any is refused) one at a time after it
    got = rules.spend_txs(txs, height, dah_height, ignore, {t.txid for t in txs} if missing_ok else ())
    assert outcome(got) == outcome(want)
    assert_same(stored(rules), kernel_state(py))


def settle(rec: Record | None) -> None:
    """The DAH rule at height 150 on a kernel record whose slots a call changed, as the module
    settles it in the same call."""
    if rec is not None and "spent_utxos" in rec.dirty:
        dah.apply_dah(rec, 150, RET)
        rec.dirty.clear()


@SETTINGS
@given(
    records(),
    st.lists(st.tuples(st.integers(0, 1), st.sampled_from([0, 1, 2, 5]), st.booleans()), max_size=4),
)
def test_unspends_agree(rules: Any, recs: dict[bytes, Record], items: list[tuple[int, int, bool]]) -> None:
    load(rules, recs)
    py = copy.deepcopy(recs)
    want, got = [], []
    for k, vout, right in items:
        tx = PARENT_TXS[k]
        op = (tx.txid, vout)
        h = (
            bytes(recs[tx.txid].utxos[vout * 68 : vout * 68 + 32])
            if tx.txid in recs and vout < 3
            else b"\x09" * 32
        )
        h = h if right else b"\x08" * 32
        want.append(spend.unspend(py.get(tx.txid), op, h, BATCH))
        settle(py.get(tx.txid))
        got.append(rules.unspend(op, h, 150))
    assert errors(got) == errors(want)
    assert_same(stored(rules), kernel_state(py))


@SETTINGS
@given(
    records(),
    st.lists(st.tuples(st.integers(0, 1), st.sampled_from([0, 1, 2, 5]), st.booleans()), max_size=4),
)
def test_take_backs_agree(rules: Any, recs: dict[bytes, Record], items: list[tuple[int, int, bool]]) -> None:
    """`take_back` of one spender's input: freed only while the slot holds that spender's data
    (`right`: the slot's own spender and vin, where it has one; else another's)."""
    load(rules, recs)
    py = copy.deepcopy(recs)
    want, got = [], []
    for k, vout, right in items:
        tx = PARENT_TXS[k]
        op = (tx.txid, vout)
        rec = py.get(tx.txid)
        held = slots.decode(bytes(rec.utxos[vout * 68 : vout * 68 + 68])) if rec and vout < 3 else None
        who, vin = (held[1], held[2]) if right and held and held[1] is not None else (OTHER, vout)
        assert who is not None and vin is not None
        want.append(spend.take_back(rec, op, who, vin, BATCH))
        settle(rec)
        got.append(rules.take_back_input(op, who, vin, 150))
    assert got == want
    assert_same(stored(rules), kernel_state(py))


VOUTS = st.sampled_from([0, 1, 2, 5])  # 5: past the record's outputs
ALERTS = st.lists(
    st.tuples(st.sampled_from(["freeze", "unfreeze", "reassign"]), st.integers(0, 1), VOUTS, st.booleans()),
    min_size=1,
    max_size=5,
)


@SETTINGS
@given(records(), ALERTS)
def test_freeze_unfreeze_reassign_agree(rules: Any, recs: dict[bytes, Record], calls: list[Any]) -> None:
    load(rules, recs)
    py = copy.deepcopy(recs)
    want, got = [], []
    for what, k, vout, right in calls:
        tx = PARENT_TXS[k]
        op = (tx.txid, vout)
        rec = py.get(tx.txid)
        h = bytes(rec.utxos[vout * 68 : vout * 68 + 32]) if rec is not None and vout < 3 else b"\x09" * 32
        h = h if right else b"\x08" * 32
        new = bytes([0x30 + vout]) * 32
        if what == "freeze":
            want.append(outputs.freeze(rec, op, h, BATCH))
        elif what == "unfreeze":
            want.append(outputs.unfreeze(rec, op, h, BATCH))
        else:
            want.append(outputs.reassign(rec, op, h, new, 200, BATCH))
        got.append(rules.alert(what, op, h, new, 200, outputs.REASSIGN_DELAY))
    assert errors(got) == errors(want)
    assert_same(stored(rules), kernel_state(py))


@SETTINGS
@given(
    records(),
    st.integers(0, 1),
    st.sampled_from([0, 1, 2, 5]),
    st.booleans(),
    st.sampled_from([98, 99, 100, 150]),
)
def test_get_spend_agrees(
    rules: Any, recs: dict[bytes, Record], k: int, vout: int, right: bool, tip: int
) -> None:
    load(rules, recs)
    tx = PARENT_TXS[k]
    rec = recs.get(tx.txid)
    h = bytes(rec.utxos[vout * 68 : vout * 68 + 32]) if rec is not None and vout < 3 else b"\x09" * 32
    h = h if right else b"\x08" * 32

    def ask(f: Any) -> Any:
        try:
            return f()
        except Exception as e:  # a mismatch is raised, by both
            return (type(e).__name__, str(e))

    want = ask(lambda: spend.spend_status(rec, (tx.txid, vout), h, tip, BATCH))
    got = ask(lambda: rules.get_spend((tx.txid, vout), h, tip))
    assert got == want


STATE_CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("mined"), st.sampled_from([7, 8, 9]), st.booleans(), st.booleans()),
        st.tuples(st.sampled_from(["longest", "locked", "conflicting"]), st.booleans()),
        st.tuples(st.just("preserve"), st.sampled_from([250, 400])),
        st.tuples(st.just("expire")),
        st.tuples(st.sampled_from(["child_conflicting", "child_deleted"]), st.sampled_from([OTHER, SPENDER])),
    ),
    min_size=1, max_size=6,
)  # fmt: skip


@SETTINGS
@given(records(), st.integers(0, 1), STATE_CALLS, st.sampled_from([100, 130, 300]))
def test_state_changes_agree(
    rules: Any, recs: dict[bytes, Record], k: int, calls: list[Any], height: int
) -> None:
    """set-mined / unset, longest chain, locked, conflicting, preserve, expiry, children: the
    same record after every sequence of them."""
    load(rules, recs)
    py = copy.deepcopy(recs)
    txid = PARENT_TXS[k].txid
    rec = py.get(txid)
    for call in calls:
        what = call[0]
        if what == "mined":
            _w, bid, longest, unset = call
            got: Any = rules.set_mined(txid, (bid, height, 2), longest, unset, height)
            if rec is not None:
                if unset:
                    marks.unset_mined(rec, bid, longest, height, RET)
                else:
                    marks.set_mined(rec, (bid, height, 2), longest, height, RET)
            assert got == (None if rec is None else [b[0] for b in rec.block_list()])
            continue
        if what.startswith("child_"):
            got = rules.add_child(txid, what[6:], call[1])
            if rec is not None:
                fresh = rec.add_child(f"{what[6:]}_children", call[1])
            assert got == (None if rec is None else fresh)
            continue
        value = int(call[1]) if len(call) > 1 else 0
        got = rules.set_state(txid, what, value, height)
        assert got == (rec is not None)
        if rec is None:
            continue
        if what == "longest":
            marks.mark_on_longest_chain(rec, bool(value), height, RET)
        elif what == "locked":
            marks.set_locked(rec, bool(value), height, RET)
        elif what == "conflicting":
            marks.set_conflicting(rec, bool(value), height, RET)
        elif what == "preserve":
            marks.preserve(rec, value)
        else:
            marks.expire_preservation(rec, height, RET)
    assert_same(stored(rules), kernel_state(py))
