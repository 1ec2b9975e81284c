"""Conformance: the script index (`stores.utxo.scriptindex`) on every backend — what a script's
listing holds through creates, spends, unspends, mining, conflicts, deletions, pruning,
multi-record transactions and snapshots; its pages and cursors; and a random run of all of it
checked against a model kept here."""

from __future__ import annotations

import random
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path

import pytest

from chain import Tx, TxIn
from chain.build import build_tx, p2pkh, spend_input
from stores.errors import StoreError
from stores.utxo import Spend, Utxo, UtxoStore, open_utxo_store
from stores.utxo.scriptindex import Balance, ScriptUtxo
from tests.stores.conftest import PAGE
from tests.stores.helpers import created, script, uhash

Outpoint = tuple[bytes, int]
OP_RETURN = b"\x00\x6a\x04data"


def h(spk: bytes) -> bytes:
    return sha256(spk).digest()


def listing(store: UtxoStore, spk: bytes, confirmed: bool = False, limit: int = 1000) -> list[ScriptUtxo]:
    """Every page of the script's listing, joined; the cursors must chain."""
    out: list[ScriptUtxo] = []
    after: str | None = None
    for _page in range(10_000):
        items, after = store.script_utxos(h(spk), after=after, limit=limit, confirmed=confirmed)
        assert len(items) <= limit
        out += items
        if after is None:
            break
        assert items, "a page with nothing on it must be the last"
        assert after == items[-1].cursor
    ops = [(u.utxo.txid, u.utxo.vout) for u in out]
    assert len(ops) == len(set(ops)), "an output listed twice"
    return out


def ops(items: list[ScriptUtxo]) -> set[Outpoint]:
    return {(u.utxo.txid, u.utxo.vout) for u in items}


def pays(spk: bytes, *values: int, parent: int | None = None) -> Tx:
    """A tx with made-up inputs paying `values` to `spk`."""
    tag = random.getrandbits(64).to_bytes(32, "big") if parent is None else parent.to_bytes(32, "big")
    return build_tx(
        [TxIn(tag, 0, b"\x51", 0xFFFFFFFF, sum(values) + 1000, p2pkh(b"\x01" * 20))],
        [(v, spk) for v in values],
    )


def test_created_outputs_are_listed_with_what_they_hold(store: UtxoStore) -> None:
    a, b = script(), script()
    t = build_tx(
        [TxIn(b"\x07" * 32, 0, b"\x51", 0xFFFFFFFF, 10**6, script())],
        [(1000, a), (0, OP_RETURN), (2000, b), (3000, a)],
    )
    created(store, t, height=120, mined=True)
    got = listing(store, a)
    assert [(u.utxo.txid, u.utxo.vout, u.utxo.satoshis, u.utxo.script, u.utxo.height, u.utxo.coinbase,
             u.confirmed) for u in got] == [
        (t.txid, 0, 1000, a, 120, False, True), (t.txid, 3, 3000, a, 120, False, True)]
    assert ops(listing(store, b)) == {(t.txid, 2)}
    assert listing(store, OP_RETURN) == []  # a data carrier is never a UTXO
    assert listing(store, script()) == []
    assert store.script_balance(h(a)) == Balance(4000, 0, 2)


def test_unmined_outputs_are_listed_unconfirmed_until_mined(store: UtxoStore) -> None:
    a = script()
    t = pays(a, 500, 700)
    created(store, t, height=100)
    assert [u.confirmed for u in listing(store, a)] == [False, False]
    assert [u.utxo.height for u in listing(store, a)] == [None, None]
    assert listing(store, a, confirmed=True) == []
    assert store.script_balance(h(a)) == Balance(0, 1200, 2)
    store.set_mined_multi([t.txid], 5, 101)
    assert [(u.confirmed, u.utxo.height) for u in listing(store, a)] == [(True, 101), (True, 101)]
    assert store.script_balance(h(a)) == Balance(1200, 0, 2)
    store.mark_on_longest_chain([t.txid], False)  # a reorg takes its block away
    store.set_mined_multi([t.txid], 5, 101, unset=True, on_longest_chain=False)
    assert [u.confirmed for u in listing(store, a)] == [False, False]
    assert store.script_balance(h(a)) == Balance(0, 1200, 2)


def test_a_spend_removes_and_an_unspend_restores(store: UtxoStore) -> None:
    a = script()
    f = pays(a, 1000, 2000)
    created(store, f, mined=True)
    c = build_tx([spend_input(f, 1)], [(1500, script())])
    spends = store.spend(c, 101)
    assert ops(listing(store, a)) == {(f.txid, 0)}
    store.spend(c, 101)  # the same spend again (a redelivered task) changes nothing
    assert ops(listing(store, a)) == {(f.txid, 0)}
    assert store.unspend(spends) == [None]
    assert ops(listing(store, a)) == {(f.txid, 0), (f.txid, 1)}
    assert store.unspend(spends) == [None]  # and taking it back twice
    assert ops(listing(store, a)) == {(f.txid, 0), (f.txid, 1)}


def test_a_refused_spend_changes_nothing(store: UtxoStore) -> None:
    a = script()
    f = pays(a, 1000)
    created(store, f, mined=True)
    good = build_tx([spend_input(f, 0)], [(900, script())])
    store.spend(good, 101)
    rival = build_tx([spend_input(f, 0)], [(800, script())])
    with pytest.raises(StoreError):
        store.spend(rival, 101)
    assert listing(store, a) == []
    store.unspend([Spend(f.txid, 0, uhash(f, 0), good.txid, 0)])
    assert ops(listing(store, a)) == {(f.txid, 0)}


def test_frozen_outputs_stay_listed(store: UtxoStore) -> None:
    a = script()
    f = pays(a, 1000)
    created(store, f, mined=True)
    assert store.freeze([((f.txid, 0), uhash(f, 0))]) == [None]
    assert ops(listing(store, a)) == {(f.txid, 0)}
    assert store.unfreeze([((f.txid, 0), uhash(f, 0))]) == [None]
    assert ops(listing(store, a)) == {(f.txid, 0)}


def test_conflicting_records_list_nothing(store: UtxoStore) -> None:
    a = script()
    t = pays(a, 1000)
    created(store, t)
    store.set_conflicting([t.txid], True)
    assert listing(store, a) == []
    assert store.script_balance(h(a)) == Balance(0, 0, 0)
    store.set_conflicting([t.txid], False)
    assert ops(listing(store, a)) == {(t.txid, 0)}
    u = pays(a, 5)
    assert store.create_many([u], 100, conflicting=True)[0] is not None
    assert ops(listing(store, a)) == {(t.txid, 0)}


def test_deleted_and_pruned_records_leave_nothing(store: UtxoStore) -> None:
    a = script()
    t, f = pays(a, 1000, 1000), pays(a, 3000)
    created(store, t, f, mined=True)
    assert store.delete_txs([t.txid]) == 1  # a refused block's record, outputs unspent
    assert ops(listing(store, a)) == {(f.txid, 0)}
    c = build_tx([spend_input(f, 0)], [(2500, script())])
    created(store, c, height=101, mined=True)
    store.spend(c, 101)
    store.set_block_height(101)
    due = store.get(f.txid).delete_at_height
    assert due is not None
    store.prune([f.txid], due)
    assert store.existing([f.txid]) == set() and listing(store, a) == []


def test_pages_chain_and_later_arrivals_come_after_the_cursor(store: UtxoStore) -> None:
    a = script()
    txs = [pays(a, *range(1000, 1000 + 3 * k + 1)) for k in range(6)]
    for t in txs:
        created(store, t, mined=True)
    want = {(t.txid, v) for t in txs for v in range(len(t.outputs))}
    for limit in (1, 2, 5, 7, 1000):
        assert ops(listing(store, a, limit=limit)) == want
    first, after = store.script_utxos(h(a), limit=5)
    assert after is not None and len(first) == 5
    late = pays(a, 42)
    created(store, late)
    rest = listing_from(store, a, after)
    assert ops(first) | ops(rest) == want | {(late.txid, 0)}
    assert not ops(first) & ops(rest)
    with pytest.raises(StoreError):
        store.script_utxos(h(a), after="not a cursor")


def listing_from(store: UtxoStore, spk: bytes, after: str | None) -> list[ScriptUtxo]:
    out: list[ScriptUtxo] = []
    while after is not None:
        items, after = store.script_utxos(h(spk), after=after, limit=3)
        out += items
    return out


def test_a_multi_record_transaction_is_listed_once_whole(paged: UtxoStore) -> None:
    a, b = script(), script()
    t = build_tx(  # 10 outputs over 3 records of 4
        [TxIn(b"\x09" * 32, 0, b"\x51", 0xFFFFFFFF, 10**7, script())],
        [(1000 + v, a if v % 3 == 0 else b) for v in range(10)],
    )
    created(paged, t, mined=True)
    assert ops(listing(paged, a, limit=2)) == {(t.txid, v) for v in (0, 3, 6, 9)}
    assert ops(listing(paged, b)) == {(t.txid, v) for v in (1, 2, 4, 5, 7, 8)}
    c = build_tx([spend_input(t, 9), spend_input(t, 4)], [(2000, script())])
    spends = paged.spend(c, 101)
    assert ops(listing(paged, a)) == {(t.txid, v) for v in (0, 3, 6)}
    assert (t.txid, 4) not in ops(listing(paged, b))
    paged.unspend(spends)
    assert ops(listing(paged, a)) == {(t.txid, v) for v in (0, 3, 6, 9)}


def test_snapshot_outputs_are_listed(store: UtxoStore) -> None:
    a = script()
    txid = b"\x33" * 32
    store.import_utxos([Utxo(txid, 0, 700, a, 90, True), Utxo(txid, 5, 800, a, 90, True)], height=95,
                       block_hash=b"\x44" * 32)
    got = listing(store, a)
    assert [(u.utxo.vout, u.utxo.satoshis, u.utxo.height, u.utxo.coinbase, u.confirmed) for u in got] == [
        (0, 700, 90, True, True), (5, 800, 90, True, True)]


@pytest.mark.parametrize("seed", range(6))
def test_a_random_run_matches_the_model(store: UtxoStore, seed: int) -> None:
    random_run(store, seed)


def random_run(store: UtxoStore, seed: int, steps: int = 40) -> None:
    """Creates (mined or not), spends (some refused), unspends, mining and unmining, conflicts
    and deletions at random over a few scripts; after every step each script's listing and
    balance are the model's."""
    rng = random.Random(seed)
    spks = [script() for _ in range(4)]
    # the model: outpoint → (script, satoshis); which are unspent; per tx: mined?, conflicting?
    outs: dict[Outpoint, tuple[bytes, int]] = {}
    unspent: set[Outpoint] = set()
    mined: dict[bytes, bool] = {}
    conflicting: set[bytes] = set()
    spent_by: dict[bytes, list[Spend]] = {}
    txs: dict[bytes, Tx] = {}
    height = 100

    def check() -> None:
        for spk in spks:
            want = {op for op in unspent if outs[op][0] == spk and op[0] not in conflicting}
            got = listing(store, spk, limit=rng.choice([1, 3, 50]))
            assert ops(got) == want
            for u in got:
                assert u.confirmed == mined[u.utxo.txid]
                assert u.utxo.satoshis == outs[(u.utxo.txid, u.utxo.vout)][1]
            conf = sum(outs[op][1] for op in want if mined[op[0]])
            total = sum(outs[op][1] for op in want)
            assert store.script_balance(h(spk)) == Balance(conf, total - conf, len(want))
            assert ops(listing(store, spk, confirmed=True)) == {op for op in want if mined[op[0]]}

    for _step in range(steps):
        action = rng.choice(
            ["fund", "fund", "spend", "spend", "unspend", "mine", "unmine", "conflict", "delete"]
        )
        if action == "fund":
            values = [rng.randrange(1, 10**6) for _ in range(rng.randrange(1, 4))]
            parent = rng.getrandbits(256).to_bytes(32, "big")
            t = build_tx(
                [TxIn(parent, 0, b"\x51", 0xFFFFFFFF, sum(values) + 10, spks[0])],
                [(v, rng.choice(spks)) for v in values],
            )
            m = rng.random() < 0.5
            created(store, t, height=height, mined=m)
            txs[t.txid] = t
            mined[t.txid] = m
            for v, o in enumerate(t.outputs):
                outs[(t.txid, v)] = (o.script, o.satoshis)
                unspent.add((t.txid, v))
        elif action == "spend" and unspent:
            free = sorted(op for op in unspent if op[0] not in conflicting)
            if not free:
                continue
            picked = rng.sample(free, min(len(free), rng.randrange(1, 3)))
            c = build_tx([spend_input(txs[t], v) for t, v in picked], [(1, rng.choice(spks))])
            spends = store.spend(c, height)
            assert {(s.txid, s.vout) for s in spends} == set(picked)
            spent_by[c.txid] = spends
            unspent -= set(picked)
        elif action == "unspend" and spent_by:
            taken = spent_by.pop(rng.choice(sorted(spent_by)))
            for s, err in zip(taken, store.unspend(taken)):
                assert (err is None) == (s.txid in txs), err  # a deleted parent has nothing to give back
                if err is None:
                    unspent.add((s.txid, s.vout))
        elif action == "mine":
            un = sorted(t for t, m in mined.items() if not m and t in txs)
            if un:
                t = rng.choice(un)
                height += 1
                store.set_mined_multi([t], height, height)
                mined[t] = True
        elif action == "unmine":
            on = sorted(t for t, m in mined.items() if m and t in txs)
            if on:
                t = rng.choice(on)
                meta = store.get(t, ["block_ids", "block_heights"])
                store.mark_on_longest_chain([t], False)
                for bid, bh in zip(meta.block_ids, meta.block_heights):
                    store.set_mined_multi([t], bid, bh, unset=True, on_longest_chain=False)
                mined[t] = False
        elif action == "conflict" and txs:
            t = rng.choice(sorted(txs))
            flag = t not in conflicting
            store.set_conflicting([t], flag)
            (conflicting.add if flag else conflicting.discard)(t)
        elif action == "delete" and txs:
            t = rng.choice(sorted(txs))
            store.delete_txs([t])
            del txs[t]
            for op in [op for op in unspent if op[0] == t]:
                unspent.discard(op)
        check()


# -- SQLite's lag: the same checks with the table taking records in after every third ----------
LAGGED = [
    test_created_outputs_are_listed_with_what_they_hold,
    test_unmined_outputs_are_listed_unconfirmed_until_mined,
    test_a_spend_removes_and_an_unspend_restores,
    test_a_refused_spend_changes_nothing,
    test_frozen_outputs_stay_listed,
    test_conflicting_records_list_nothing,
    test_deleted_and_pruned_records_leave_nothing,
    test_pages_chain_and_later_arrivals_come_after_the_cursor,
    test_snapshot_outputs_are_listed,
]


def lagged_store(tmp_path: Path, lag: int = 3, **opts: object) -> UtxoStore:
    """A SQLite store whose script index leaves its newest `lag` records to the query's scan."""
    return open_utxo_store(f"sqlite:///{tmp_path}/lagged.db", retention=288, index_lag=lag,
                           blob_url=f"file://{tmp_path}/blobs", **opts)


@pytest.mark.parametrize("body", LAGGED, ids=lambda f: f.__name__.removeprefix("test_"))
def test_with_a_small_lag(body: Callable[[UtxoStore], None], tmp_path: Path) -> None:
    s = lagged_store(tmp_path)
    try:
        body(s)
    finally:
        s.close()


def test_a_multi_record_transaction_with_a_small_lag(tmp_path: Path) -> None:
    s = lagged_store(tmp_path, batch_size=PAGE)
    try:
        for _ in range(4):  # older records first: the big one is taken in by the mark at once
            created(s, pays(script(), 1))
        test_a_multi_record_transaction_is_listed_once_whole(s)
        for _ in range(4):
            created(s, pays(script(), 1))
        test_a_multi_record_transaction_is_listed_once_whole(lagged_store(tmp_path, batch_size=PAGE))
    finally:
        s.close()


@pytest.mark.parametrize(("seed", "lag"), [(s, lag) for s in range(6) for lag in (1, 2)])
def test_a_random_run_with_a_small_lag_matches_the_model(tmp_path: Path, seed: int, lag: int) -> None:
    s = lagged_store(tmp_path, lag)
    try:
        random_run(s, seed, 80)
        at = int(s.db.read("mark", lambda cur: s._meta(cur, "script_index_at")) or 0)  # type: ignore[attr-defined]
        assert at > 0, "the mark never moved: the table was not exercised"
    finally:
        s.close()


def test_only_sqlite_takes_a_lag(store_url: str, tmp_path: Path) -> None:
    if store_url.startswith("sqlite"):
        lagged_store(tmp_path).close()
        return
    with pytest.raises((ValueError, TypeError)):
        open_utxo_store(store_url, index_lag=3)


def test_a_store_keeps_the_lag_it_was_made_with(tmp_path: Path) -> None:
    """The lag is the store's, as its batch size: opened with another, it keeps its own (a table
    kept with a mark holds only what is below it)."""
    a = script()
    s = lagged_store(tmp_path, 2)
    txs = [pays(a, 100 + k) for k in range(5)]
    try:
        for t in txs:
            created(s, t, mined=True)
    finally:
        s.close()
    want = {(t.txid, 0) for t in txs}
    for lag in (0, 2, 50):
        again = lagged_store(tmp_path, lag)
        try:
            assert again.index_lag == 2  # type: ignore[attr-defined]
            assert ops(listing(again, a, limit=2)) == want
        finally:
            again.close()


def test_a_snapshot_of_a_multi_record_tx_with_a_small_lag(tmp_path: Path) -> None:
    """A snapshot's chunk moves the mark past its own multi-record tx: its pages are in first."""
    a = script()
    s = lagged_store(tmp_path, 3, batch_size=PAGE)
    try:
        big = b"\x55" * 32
        utxos = [Utxo(big, v, 1000 + v, a, 90, False) for v in range(10)]
        utxos += [Utxo(bytes([k]) * 32, 0, 7, a, 90, False) for k in range(1, 4)]
        s.import_utxos(utxos, height=95, block_hash=b"\x44" * 32)
        assert ops(listing(s, a, limit=3)) == {(u.txid, u.vout) for u in utxos}
        at = int(s.db.read("mark", lambda cur: s._meta(cur, "script_index_at")) or 0)  # type: ignore[attr-defined]
        assert at > 0
    finally:
        s.close()
