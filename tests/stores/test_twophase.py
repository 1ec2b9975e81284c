"""Conformance: transactions spanning several records (two-phase creation, Teranode's lock-record
pattern) and their external blobs, on every store backend × every blob backend.

The store under test keeps PAGE (4) outputs per record, so a 10-output transaction has a master
(outputs 0–3) and two children (4–7, 8–9). Crash points with real SIGKILLs are in
test_twophase_crash.py; here each recovery path is driven step by step in one process.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from chain import Tx, parse_tx
from chain.build import build_tx, spend_input
from stores.blob.protocol import blob_key
from stores.utxo import (
    BlockInfo,
    SpendRejected,
    SpendStatus,
    StorageError,
    TxCreating,
    TxExists,
    UtxoFrozen,
    UtxoMismatch,
    UtxoNotFound,
    UtxoSpent,
    UtxoStore,
    open_utxo_store,
    twophase,
)
from tests.processes import race
from tests.stores.conftest import PAGE
from tests.stores.helpers import child, created, funding, script, uhash

N_OUT = 10
CARRIER = 5  # a zero-satoshi OP_RETURN output: it keeps its position, but has no UTXO


def big_tx(store: UtxoStore, n: int = N_OUT, carrier: int | None = CARRIER) -> Tx:
    """A tx of `n` outputs spending a mined funding output (so its extended form is known)."""
    fund = funding(1, value=10**8)
    created(store, fund, height=50, mined=True)
    outs = [(0, b"\x6a\x04data") if v == carrier else (1000 + v, script()) for v in range(n)]
    return build_tx([spend_input(fund, 0)], outs)


def real_vouts(tx: Tx) -> list[int]:
    return [v for v, o in enumerate(tx.outputs) if o.satoshis or o.script[:1] != b"\x6a"]


def spend_all(store: UtxoStore, tx: Tx, height: int = 101) -> Tx:
    spender = child(*[(tx, v) for v in real_vouts(tx)], fee=0)
    store.spend(spender, height)
    return spender


def test_a_big_tx_spans_pages_and_reads_back_whole(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    meta = paged.create(tx, 100)
    assert (meta.total_extra_recs, meta.external, meta.creating) == (2, True, False)
    assert meta.total_utxos == N_OUT - 1 and meta.fee == 10**8 - sum(o.satoshis for o in tx.outputs)
    got = paged.get(tx.txid)
    assert (got.total_extra_recs, got.external, got.creating, got.total_utxos) == (2, True, False, 9)
    assert got.tx is not None and got.tx.txid == tx.txid and got.tx.outputs == tx.outputs
    blob = paged.external.blobs.get(blob_key(tx.txid, "tx"))  # type: ignore[attr-defined]
    assert parse_tx(blob).is_extended  # spends and validation of it need no parent lookups
    outs = paged.get_outputs([(tx.txid, v) for v in range(N_OUT + 1)])
    assert sorted(v for _t, v in outs) == real_vouts(tx)  # the carrier and vout 10 have no UTXO
    for v in real_vouts(tx):
        o, want = outs[(tx.txid, v)], tx.outputs[v]
        assert (o.utxo_hash, o.satoshis, o.script) == (uhash(tx, v), want.satoshis, want.script)


def test_spenders_reads_each_page_and_no_blob(paged: UtxoStore) -> None:
    """`spenders` of a tx over several records: each output's spender from its own page, the
    carrier and a vout past the end left out; it reads no output bytes, so it answers the same
    with the blob gone (where `get_outputs` fails)."""
    tx = big_tx(paged)
    paged.create(tx, 100)
    x, y = child((tx, 1), (tx, 9)), child((tx, 4))
    paged.spend_many([x, y], 101)
    want = {(tx.txid, v): None for v in real_vouts(tx)} | {
        (tx.txid, 1): x.txid, (tx.txid, 9): x.txid, (tx.txid, 4): y.txid
    }
    ops = [(tx.txid, v) for v in range(N_OUT + 1)]
    assert paged.spenders(ops) == want
    paged.external.blobs.delete(blob_key(tx.txid, "tx"))  # type: ignore[attr-defined]
    assert paged.spenders(ops) == want
    with pytest.raises(StorageError):
        paged.get_outputs(ops)
    # a conflicting master is named for an output only its last page holds (the flag is the
    # master's, whichever page the slot is read from)
    paged.set_conflicting([tx.txid], True)
    assert paged.spenders([(tx.txid, 9)]).conflicting == {tx.txid}


def test_spends_on_every_page_keep_exact_counts(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    paged.create(tx, 100)
    a = child((tx, 0), (tx, 4), (tx, 9))
    spends = paged.spend(a, 101)
    assert [(s.vout, s.spending_vin) for s in spends] == [(0, 0), (4, 1), (9, 2)]
    assert paged.spend(a, 101) == spends  # the same spender again: idempotent
    assert paged.get(tx.txid).spent_utxos == 3
    b = child((tx, 8), (tx, 9))
    with pytest.raises(SpendRejected) as e:
        paged.spend(b, 101)
    err = dict(e.value.errors)[1]
    assert isinstance(err, UtxoSpent) and (err.spending_txid, err.spending_vin) == (a.txid, 2)
    assert paged.get_spend((tx.txid, 8), uhash(tx, 8)).status is SpendStatus.OK  # b's input 0 rolled back
    info = paged.get_spend((tx.txid, 4), uhash(tx, 4))
    assert (info.status, info.spending_txid, info.spending_vin) == (SpendStatus.SPENT, a.txid, 1)
    with pytest.raises(SpendRejected) as e:
        paged.spend(child((tx, CARRIER), fee=0), 101)
    assert isinstance(e.value.first, UtxoNotFound)
    wrong = spends[1]._replace(utxo_hash=b"\x99" * 32)
    assert isinstance(paged.unspend([wrong])[0], UtxoMismatch)
    assert paged.unspend([spends[1]]) == [None]  # on page 1, by its UTXO hash
    assert paged.get(tx.txid).spent_utxos == 2
    assert paged.get_spend((tx.txid, 4), uhash(tx, 4)).status is SpendStatus.OK


def test_dah_waits_for_every_page(paged: UtxoStore) -> None:
    paged.set_block_height(100)
    tx = big_tx(paged)
    paged.create(tx, 100, [BlockInfo(7, 100)])
    last = child((tx, 9))
    everything_else = child(*[(tx, v) for v in real_vouts(tx) if v != 9], fee=0)
    paged.spend(everything_else, 101)
    assert paged.get(tx.txid).delete_at_height is None  # output 9, on the last page, is unspent
    spends = paged.spend(last, 101)
    assert paged.get(tx.txid).delete_at_height == 101 + 288  # the spending block's height
    paged.unspend(spends)
    assert paged.get(tx.txid).delete_at_height is None


def test_a_duplicate_create_is_txexists_and_changes_nothing(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    paged.create(tx, 100)
    paged.spend(child((tx, 9)), 101)
    with pytest.raises(TxExists):
        paged.create(tx, 100)
    (r,) = paged.create_many([tx], 100)
    assert isinstance(r, TxExists)
    assert paged.get(tx.txid).spent_utxos == 1


def test_a_held_lock_makes_create_report_txexists(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    lock = paged.acquire_creation_lock(tx.txid, 3)
    assert lock is not None
    with pytest.raises(TxExists, match="being created"):
        paged.create(tx, 100)
    assert paged.release_creation_lock(lock)
    assert paged.create(tx, 100).total_extra_recs == 2


def half_created(store: UtxoStore, tx: Tx, pages: list[int]) -> None:
    """Steps 1–4 of the protocol with only `pages` of the children written, as a creator that
    stopped there would leave it (its lock released)."""
    rec = twophase.master_record(
        store, tx, 100, (), locked=False, conflicting=False, frozen=False, fee=None  # type: ignore[arg-type]
    )
    creation = twophase.begin_creation(store, tx, rec, frozen=False)  # type: ignore[arg-type]
    twophase.write_pages(store, tx, pages, frozen=False)  # type: ignore[arg-type]
    store.release_creation_lock(creation.lock)


def test_while_the_master_is_creating_nothing_can_be_spent(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    half_created(paged, tx, [1])
    assert paged.get(tx.txid).creating
    for v in (0, 4, 9):
        with pytest.raises(SpendRejected) as e:
            paged.spend(child((tx, v)), 101)
        assert isinstance(e.value.first, TxCreating)
        assert paged.get_spend((tx.txid, v), uhash(tx, v)).status is SpendStatus.LOCKED
    assert paged.get(tx.txid).spent_utxos == 0


def test_a_reader_can_finish_the_commit(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    half_created(paged, tx, [2])  # page 1 missing
    assert paged.complete_creation(tx.txid)  # type: ignore[attr-defined]
    assert not paged.get(tx.txid).creating
    spend_all(paged, tx)
    assert paged.get(tx.txid).spent_utxos == N_OUT - 1


def test_set_mined_finishes_the_commit(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    other = funding(2)
    created(paged, other, height=100)
    half_created(paged, tx, [])
    assert paged.set_mined_multi([other.txid, tx.txid], 3, 100) == [[3], [3]]
    meta = paged.get(tx.txid)
    assert (meta.creating, meta.block_ids, meta.unmined_since) == (False, [3], None)
    spend_all(paged, tx)


def test_set_mined_rebuilds_a_tx_only_its_blob_holds(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    # A creator that died right after step 2 leaves its lock row and the blob, nothing else.
    assert paged.acquire_creation_lock(tx.txid, 3, {"block_height": 100}) is not None
    paged.external.put_tx(tx)  # type: ignore[attr-defined]
    other = big_tx(paged)
    paged.external.put_tx(other)  # type: ignore[attr-defined]  # a blob without a lock row: left alone
    assert paged.set_mined_multi([tx.txid, other.txid], 3, 100)[0] == [3]
    assert paged.get(tx.txid).total_extra_recs == 2
    spend_all(paged, tx)


def test_a_retry_completes_the_creation_then_reports_txexists(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    half_created(paged, tx, [1])
    with pytest.raises(TxExists, match="earlier creation was completed"):
        paged.create(tx, 100)
    assert not paged.get(tx.txid).creating
    spend_all(paged, tx)


def test_frozen_creation_freezes_every_page(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    (meta,) = paged.create_many([tx], 100, frozen=True)
    assert not isinstance(meta, Exception)
    for v in (0, 9):
        with pytest.raises(SpendRejected) as e:
            paged.spend(child((tx, v)), 101)
        assert isinstance(e.value.first, UtxoFrozen)
    assert paged.unfreeze([((tx.txid, 9), uhash(tx, 9))]) == [None]
    paged.spend(child((tx, 9)), 101)


def test_freeze_and_reassign_an_output_of_a_child_page(paged: UtxoStore) -> None:
    paged.set_block_height(100)
    tx = big_tx(paged)
    paged.create(tx, 100)
    assert paged.freeze([((tx.txid, 6), uhash(tx, 6))]) == [None]
    assert paged.get_spend((tx.txid, 6), uhash(tx, 6)).status is SpendStatus.FROZEN
    new_hash = b"\x77" * 32
    paged.reassign((tx.txid, 6), uhash(tx, 6), new_hash)
    o = paged.get_output((tx.txid, 6))
    assert o is not None and o.utxo_hash == new_hash and o.spendable_in == 100 + 1000
    assert paged.get_output((tx.txid, 7)) is not None  # its neighbour is untouched


def test_the_confirmed_view_lists_every_page(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    paged.create(tx, 100, [BlockInfo(1, 100)])
    spender = child((tx, 4))
    created(paged, spender, height=101)
    paged.spend(spender, 101)  # by an unmined spender: still unspent in the confirmed view
    mine = [u for u in paged.iter_utxos(confirmed=True) if u.txid == tx.txid]
    assert [u.vout for u in mine] == real_vouts(tx)
    assert all((u.satoshis, u.script) == (tx.outputs[u.vout].satoshis, tx.outputs[u.vout].script)
               for u in mine)
    assert paged.stats().utxos == len(real_vouts(tx)) + 1  # and the funding output (not spent here)


def test_pruning_removes_every_page_and_the_blob(paged: UtxoStore) -> None:
    paged.set_block_height(100)
    tx = big_tx(paged)
    paged.create(tx, 100, [BlockInfo(1, 100)])
    spender = spend_all(paged, tx)
    paged.set_mined_multi([spender.txid], 2, 101)
    dah = paged.get(tx.txid).delete_at_height
    assert dah is not None
    assert paged.delete_expired([tx.txid], dah) == 1
    assert paged.external.blobs.exists(blob_key(tx.txid, "tx")) is False  # type: ignore[attr-defined]
    assert paged.get_outputs([(tx.txid, 9)]) == {}
    # A new store of the same txid starts from nothing: no child page was left behind.
    assert paged.create(tx, 102).total_extra_recs == 2
    assert paged.get(tx.txid).spent_utxos == 0


def _write_group(url: str, blob_url: str, raw: str, pages: list[int], barrier: Any, out: Any) -> None:
    store = open_utxo_store(url, batch_size=PAGE, blob_url=blob_url)
    tx = parse_tx(bytes.fromhex(raw))
    barrier.wait(timeout=60)
    out.put(twophase.write_pages(store, tx, pages, frozen=False))  # type: ignore[arg-type]
    store.close()


def test_pages_written_by_several_workers_at_once(store_url: str, tmp_path: Any) -> None:
    blob_url = f"file://{tmp_path}/blobs"
    store = open_utxo_store(store_url, batch_size=PAGE, blob_url=blob_url)
    tx = big_tx(store, n=41, carrier=None)  # 11 pages
    rec = twophase.master_record(
        store, tx, 100, (), locked=False, conflicting=False, frozen=False, fee=None  # type: ignore[arg-type]
    )
    creation = twophase.begin_creation(store, tx, rec, frozen=False)  # type: ignore[arg-type]
    raw = tx.serialize(extended=True).hex()
    groups = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [4, 5, 6, 7]]  # the third overlaps both
    made = race(_write_group, [(store_url, blob_url, raw, g) for g in groups])
    assert sum(made) == 10  # every page written exactly once, whoever won each
    assert twophase.end_creation(store, creation)  # type: ignore[arg-type]
    meta = store.get(tx.txid)
    assert (meta.creating, meta.total_extra_recs, meta.total_utxos) == (False, 10, 41)
    spend_all(store, tx)
    assert store.get(tx.txid).spent_utxos == 41
    store.close()


def test_a_snapshot_record_spans_only_the_pages_it_needs(store_url: str, tmp_path: Any) -> None:
    from stores.utxo import Utxo
    from stores.utxo.kernel.create import page_count

    store = open_utxo_store(
        store_url, batch_size=PAGE, blob_url=f"file://{tmp_path}/blobs", max_tx_size_in_store=120
    )
    txid, top = b"\x5a" * 32, 2**32 - 1  # the highest vout there can be: ~a billion pages apart
    vouts = [0, 3, 9, top]
    entries = [Utxo(txid, v, 1000 + v % 7, script(), 7, False) for v in vouts]
    assert store.import_utxos(entries, height=8) == 4
    meta = store.get(txid)
    pages = page_count(top + 1, PAGE)
    assert (meta.total_utxos, meta.total_extra_recs, meta.external) == (4, pages - 1, True)
    outs = store.get_outputs([(txid, v) for v in (*vouts, 1, 8, 10, top - 1)])
    assert sorted(v for _t, v in outs) == vouts  # listed outputs only; gaps have no UTXO
    assert all(outs[(txid, u.vout)].script == u.script for u in entries)  # from the .outputs blob
    assert [u.vout for u in store.iter_utxos() if u.txid == txid] == vouts
    spender = build_tx([spend_input_of(e) for e in entries[2:]], [(1, script())])
    spends = store.spend(spender, 9)
    assert [s.vout for s in spends] == [9, top]
    assert store.get(txid).spent_utxos == 2
    store.close()


def spend_input_of(u: Any) -> Any:
    from chain import TxIn

    return TxIn(u.txid, u.vout, b"\x51", 0xFFFFFFFF, u.satoshis, u.script)


def test_a_failed_phase_two_still_reports_success_and_recovery_finishes(
    store_url: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault injection: the database refuses the master's flag clear once (as if the connection
    dropped at that moment). Creation still succeeds — every record is written — and the
    transaction stays unspendable until a recovery path clears the flag."""
    store = open_utxo_store(store_url, batch_size=PAGE, blob_url=f"file://{tmp_path}/blobs")
    real = store.clear_creating_master  # type: ignore[attr-defined]
    failures = iter([StorageError("database went away while clearing the flag")])

    def flaky(txid: bytes) -> bool:
        err = next(failures, None)
        if err is not None:
            raise err
        return bool(real(txid))

    store.clear_creating_master = flaky  # type: ignore[method-assign]
    tx = big_tx(store)
    with caplog.at_level("WARNING", logger="utxoflow.twophase"):
        meta = store.create(tx, 100)
    assert meta.creating and "creating flag is not cleared" in caplog.text
    assert store.get(tx.txid).creating
    with pytest.raises(SpendRejected) as e:
        store.spend(child((tx, 0)), 101)
    assert isinstance(e.value.first, TxCreating)
    assert store.complete_creation(tx.txid)  # type: ignore[attr-defined]
    spend_all(store, tx)
    store.close()


def test_recovery_keeps_frozen_when_page_zero_holds_only_data_carriers(paged: UtxoStore) -> None:
    fund = funding(1, value=10**8)
    created(paged, fund, height=50, mined=True)
    outs = [(0, b"\x6a\x01" + bytes([v])) if v < PAGE else (1000 + v, script()) for v in range(N_OUT)]
    tx = build_tx([spend_input(fund, 0)], outs)
    rec = twophase.master_record(
        paged, tx, 100, (), locked=False, conflicting=False, frozen=True, fee=None  # type: ignore[arg-type]
    )
    creation = twophase.begin_creation(paged, tx, rec, frozen=True)  # type: ignore[arg-type]
    paged.release_creation_lock(creation.lock)  # the creator stops here: no child page yet
    with pytest.raises(SpendRejected) as e:
        paged.spend(child((tx, 4)), 101)
    assert isinstance(e.value.first, TxCreating)
    (err,) = paged.freeze([((tx.txid, 4), uhash(tx, 4))])
    assert isinstance(err, TxCreating)
    assert paged.complete_creation(tx.txid)  # type: ignore[attr-defined]
    for v in (4, 9):  # on the child pages recovery wrote: frozen, as the creation asked
        assert paged.get_spend((tx.txid, v), uhash(tx, v)).status is SpendStatus.FROZEN


def test_an_unfinished_creation_is_not_in_the_views(paged: UtxoStore) -> None:
    tx = big_tx(paged)
    rec = twophase.master_record(
        paged, tx, 100, [BlockInfo(1, 100)], locked=False, conflicting=False, frozen=False,  # type: ignore[arg-type]
        fee=None,
    )
    creation = twophase.begin_creation(paged, tx, rec, frozen=False)  # type: ignore[arg-type]
    paged.release_creation_lock(creation.lock)
    for confirmed in (True, False):
        assert [u for u in paged.iter_utxos(confirmed=confirmed) if u.txid == tx.txid] == []
    assert paged.complete_creation(tx.txid)  # type: ignore[attr-defined]
    assert [u.vout for u in paged.iter_utxos() if u.txid == tx.txid] == real_vouts(tx)


def test_set_mined_mines_the_rest_when_one_creation_cannot_be_finished(paged: UtxoStore) -> None:
    ok, stuck = funding(2), big_tx(paged)
    created(paged, ok, height=100)
    half_created(paged, stuck, [1])
    paged.external.blobs.delete(blob_key(stuck.txid, "tx"))  # type: ignore[attr-defined]
    res = paged.set_mined_multi([ok.txid, stuck.txid], 4, 100)
    assert res == [[4], [4]]  # both mined; the stuck one stays unspendable until it can finish
    assert paged.get(stuck.txid, ["creating"]).creating and not paged.get(ok.txid).unmined_since
    with pytest.raises(SpendRejected) as e:
        paged.spend(child((stuck, 0)), 101)
    assert isinstance(e.value.first, TxCreating)


def test_half_done_creations_are_found_and_only_those(paged: UtxoStore, tmp_path: Any) -> None:
    """What the recovery manager asks for: masters still creating that no live lock covers,
    and lapsed locks that left no master; never a complete tx or a creation under way."""
    done, half, under_way, lapsed_bare, lapsed_half = (big_tx(paged) for _ in range(5))
    paged.create(done, 100)
    half_created(paged, half, [1])  # its creator stopped after a page, lock released
    rec = twophase.master_record(
        paged, under_way, 100, (), locked=False, conflicting=False, frozen=False, fee=None  # type: ignore[arg-type]
    )
    live = twophase.begin_creation(paged, under_way, rec, frozen=False)  # type: ignore[arg-type]
    short = open_utxo_store(
        paged.url, batch_size=PAGE, blob_url=paged.external.url, lock_base_ttl=1, lock_per_record_ttl=0,
        lock_max_ttl=1,
    )
    try:
        assert short.acquire_creation_lock(lapsed_bare.txid, 3) is not None  # died before its master
        rec2 = twophase.master_record(
            short, lapsed_half, 100, (), locked=False, conflicting=False, frozen=False, fee=None  # type: ignore[arg-type]
        )
        twophase.begin_creation(short, lapsed_half, rec2, frozen=False)  # type: ignore[arg-type]
        assert paged.half_done_creations() == [half.txid]
        time.sleep(1.1)  # both short locks lapse
        three = sorted([half.txid, lapsed_bare.txid, lapsed_half.txid])
        assert paged.half_done_creations() == three
        assert len(paged.half_done_creations(limit=1)) == 1
        assert paged.complete_creation(half.txid) and paged.complete_creation(lapsed_half.txid)
        assert paged.half_done_creations() == [lapsed_bare.txid]
    finally:
        short.close()
    paged.release_creation_lock(live.lock)
    assert under_way.txid in paged.half_done_creations()  # its lock gone, the master still creating


def test_set_mined_of_a_creation_it_cannot_finish_still_records_the_block(paged: UtxoStore) -> None:
    """Its blob gone, a half-made creation cannot be finished: set-mined says why in the log, still
    records the block on the master (which stays creating: nothing of it can be spent), and mines
    the rest of the batch. On Aerospike the first call leaves a creating master untouched
    (TX_CREATING) and the second, after the attempt to finish, records the block: the same end."""
    tx = big_tx(paged)
    other = funding(2)
    created(paged, other, height=100)
    half_created(paged, tx, [1])
    paged.external.delete(tx.txid)  # type: ignore[attr-defined]
    assert paged.set_mined_multi([tx.txid, other.txid], 3, 100) == [[3], [3]]
    meta = paged.get(tx.txid, ["creating", "block_ids"])  # (not the transaction: its blob is gone)
    assert (meta.creating, meta.block_ids) == (True, [3])
    assert paged.get(other.txid).block_ids == [3]
    with pytest.raises(SpendRejected) as e:
        paged.spend(child((tx, 0)), 101)
    assert isinstance(e.value.first, TxCreating)


def test_one_call_spends_outputs_on_many_pages_and_of_many_parents(paged: UtxoStore) -> None:
    """A call that rewrites many records at once (PostgreSQL writes them as one statement over
    arrays from 8 rows on): 39 outputs on 10 pages of one transaction, then 12 parents."""
    tx = big_tx(paged, n=40)
    created(paged, tx)
    vouts = real_vouts(tx)
    spender = child(*[(tx, v) for v in vouts])
    (spent,) = paged.spend_many([spender], 101)
    assert not isinstance(spent, Exception), spent
    assert paged.get(tx.txid).spent_utxos == len(vouts) == 39
    for v in vouts:
        info = paged.get_spend((tx.txid, v), uhash(tx, v))
        assert (info.status, info.spending_txid, info.spending_vin) == (
            SpendStatus.SPENT, spender.txid, vouts.index(v)
        )
    parents = [funding(1) for _ in range(12)]
    created(paged, *parents)
    kids = [child((p, 0)) for p in parents]
    assert not [r for r in paged.spend_many(kids, 101) if isinstance(r, Exception)]
    assert [paged.get(p.txid).spent_utxos for p in parents] == [1] * 12
    spenders = [paged.get_spend((p.txid, 0), uhash(p, 0)).spending_txid for p in parents]
    assert spenders == [k.txid for k in kids]
