"""Conformance: spending and its rules, in the order the store checks them (every backend)."""

from __future__ import annotations

import pytest

from chain import TxIn
from chain.build import build_tx
from stores.utxo import (
    BlockInfo,
    SpendRejected,
    TxCoinbaseImmature,
    TxConflicting,
    TxLocked,
    TxNotFound,
    UtxoFrozen,
    UtxoMismatch,
    UtxoNotFound,
    UtxoSpent,
    UtxoStore,
)
from stores.utxo.values import Spend
from tests.stores.helpers import child, coinbase, created, funding, script, uhash


def _only(e: SpendRejected) -> Exception:
    assert len(e.errors) == 1
    return e.errors[0][1]


def test_spend_records_spender_and_counts(store: UtxoStore) -> None:
    f = funding(2)
    created(store, f)
    c = child((f, 1))
    spends = store.spend(c, 101)
    assert [(s.txid, s.vout, s.spending_txid, s.spending_vin) for s in spends] == [(f.txid, 1, c.txid, 0)]
    assert spends[0].utxo_hash == uhash(f, 1)
    out = store.get_output((f.txid, 1))
    assert out is not None and out.state == "spent" and out.spending_txid == c.txid
    assert out.spending_vin == 0
    assert store.get(f.txid).spent_utxos == 1


def test_double_spend_names_the_winner(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    winner, loser = child((f, 0), fee=100), child((f, 0), fee=200)
    store.spend(winner, 101)
    with pytest.raises(SpendRejected) as e:
        store.spend(loser, 101)
    err = _only(e.value)
    assert isinstance(err, UtxoSpent) and err.code == "UTXO_SPENT"
    assert err.spending_txid == winner.txid and err.spending_vin == 0
    assert err.outpoint == (f.txid, 0)
    assert store.get(f.txid).spent_utxos == 1


def test_double_spend_within_one_batch(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    a, b = child((f, 0), fee=100), child((f, 0), fee=200)
    ra, rb = store.spend_many([a, b], 101)
    assert isinstance(ra, list)
    assert isinstance(rb, SpendRejected) and isinstance(rb.first, UtxoSpent)
    assert rb.first.spending_txid == a.txid


def test_respend_by_the_same_spender_is_ok(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    c = child((f, 0))
    first = store.spend(c, 101)
    again = store.spend(c, 101)
    assert first == again
    assert store.get(f.txid).spent_utxos == 1


def test_missing_parent(store: UtxoStore) -> None:
    c = child((funding(1), 0))
    with pytest.raises(SpendRejected) as e:
        store.spend(c, 101)
    err = _only(e.value)
    assert isinstance(err, TxNotFound) and err.outpoint == (c.inputs[0].prev_txid, 0)


def test_a_tx_missing_thousands_of_parents_is_refused_in_a_short_message(store: UtxoStore) -> None:
    """Every failed input is in `errors` (and to_json); the message names the first few and counts
    the rest: it ends up in log lines, task results and `utxo recover` (a 660 KB line before)."""
    c = child(*((funding(1), 0) for _ in range(2000)))
    with pytest.raises(SpendRejected) as e:
        store.spend(c, 101)
    rej = e.value
    assert len(rej.errors) == 2000 and all(isinstance(x, TxNotFound) for _v, x in rej.errors)
    assert len(rej.to_json()["inputs"]) == 2000  # type: ignore[arg-type]
    text = str(rej)
    assert text.count("[TX_NOT_FOUND]") == SpendRejected.LISTED
    assert text.endswith("and 1995 more of its inputs")
    assert len(text) < 2000, len(text)


def test_missing_output(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    bad = build_tx([TxIn(f.txid, 5, b"\x51", 0xFFFFFFFF, 1, b"\x51")], [(1, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(bad, 101)
    assert isinstance(_only(e.value), UtxoNotFound)


def test_wrong_script_is_a_mismatch(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    o = f.outputs[0]
    bad = build_tx([TxIn(f.txid, 0, b"\x51", 0xFFFFFFFF, o.satoshis, script())], [(1, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(bad, 101)
    err = _only(e.value)
    assert isinstance(err, UtxoMismatch) and err.code == "UTXO_HASH_MISMATCH"
    wrong_value = build_tx([TxIn(f.txid, 0, b"\x51", 0xFFFFFFFF, o.satoshis + 1, o.script)], [(1, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(wrong_value, 101)
    assert isinstance(_only(e.value), UtxoMismatch)
    assert store.get_output((f.txid, 0)).state == "unspent"  # type: ignore[union-attr]


def test_a_failed_input_leaves_no_spend_of_that_tx(store: UtxoStore) -> None:
    f = funding(2)
    created(store, f)
    other = child((f, 1))
    store.spend(other, 101)
    ghost = funding(1)
    c = child((f, 0), (f, 1), (ghost, 0))
    with pytest.raises(SpendRejected) as e:
        store.spend(c, 101)
    kinds = [(vin, type(err)) for vin, err in e.value.errors]
    assert kinds == [(1, UtxoSpent), (2, TxNotFound)]  # each input's own error, input 0 fine
    assert store.get_output((f.txid, 0)).state == "unspent"  # type: ignore[union-attr]
    assert store.get(f.txid).spent_utxos == 1


def test_same_outpoint_twice_in_one_tx_is_refused(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    c = child((f, 0), (f, 0))
    with pytest.raises(SpendRejected):
        store.spend(c, 101)
    assert store.get_output((f.txid, 0)).state == "unspent"  # type: ignore[union-attr]


def test_locked_parent(store: UtxoStore) -> None:
    f = funding(1)
    store.create(f, 100, locked=True)
    with pytest.raises(SpendRejected) as e:
        store.spend(child((f, 0)), 101)
    assert type(_only(e.value)) is TxLocked
    store.set_locked([f.txid], False)
    store.spend(child((f, 0)), 101)


def test_conflicting_parent(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    store.set_conflicting([f.txid], True)
    with pytest.raises(SpendRejected) as e:
        store.spend(child((f, 0)), 101)
    assert isinstance(_only(e.value), TxConflicting)


def test_frozen_output(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    assert store.freeze([((f.txid, 0), uhash(f, 0))]) == [None]
    with pytest.raises(SpendRejected) as e:
        store.spend(child((f, 0)), 101)
    err = _only(e.value)
    assert isinstance(err, UtxoFrozen) and err.until is None
    assert store.unfreeze([((f.txid, 0), uhash(f, 0))]) == [None]
    store.spend(child((f, 0)), 101)


def test_reassigned_output_is_refused_through_its_spendable_height(store: UtxoStore) -> None:
    """Reassigned at tip 200: `spendable_in` is 1200, and Teranode refuses while spendable_in >=
    the spend's height, so a block at 1200 may not spend it and one at 1201 may."""
    f = funding(1)
    created(store, f)
    store.set_block_height(200)
    store.freeze([((f.txid, 0), uhash(f, 0))])
    new_script = script()
    from chain import utxo_hash

    value = f.outputs[0].satoshis
    new_hash = utxo_hash(f.txid, 0, new_script, value)
    store.reassign((f.txid, 0), uhash(f, 0), new_hash)
    spender = build_tx([TxIn(f.txid, 0, b"\x51", 0xFFFFFFFF, value, new_script)], [(value - 10, script())])
    for height in (1199, 1200):
        with pytest.raises(SpendRejected) as e:
            store.spend(spender, height)
        err = _only(e.value)
        assert isinstance(err, UtxoFrozen) and err.until == 1201
    assert store.spend(spender, 1201)[0].utxo_hash == new_hash
    # the old owner's script no longer matches
    assert store.get_output((f.txid, 0)).utxo_hash == new_hash  # type: ignore[union-attr]


def test_immature_coinbase_fails_at_99_and_succeeds_at_100(store: UtxoStore) -> None:
    cb = coinbase(1000)
    store.create(cb, 1000, [BlockInfo(1, 1000)])
    spender = child((cb, 0))
    with pytest.raises(SpendRejected) as e:
        store.spend(spender, 1099)
    err = _only(e.value)
    assert isinstance(err, TxCoinbaseImmature) and err.spendable_at == 1100
    store.spend(spender, 1100)


def test_check_order_creating_before_conflicting_before_locked(store: UtxoStore) -> None:
    f = funding(1)
    store.create(f, 100, locked=True, conflicting=True)
    with pytest.raises(SpendRejected) as e:
        store.spend(child((f, 0)), 101)
    assert isinstance(_only(e.value), TxConflicting)


def test_unspend_goes_by_the_utxo_hash_whoever_spent(store: UtxoStore) -> None:
    """Teranode's unspend clears an output by its UTXO hash, whoever the spender named in the
    request (it was `False` and a silent no-op for a stranger before); a wrong hash is an error,
    and an output that is unspent already is nothing to do."""
    f = funding(1)
    created(store, f)
    c = child((f, 0))
    (s,) = store.spend(c, 101)
    assert isinstance(store.unspend([s._replace(utxo_hash=b"\x09" * 32)])[0], UtxoMismatch)
    assert store.get_output((f.txid, 0)).spending_txid == c.txid  # type: ignore[union-attr]
    stranger = s._replace(spending_txid=b"\x42" * 32, spending_vin=3)
    assert store.unspend([stranger]) == [None]
    assert store.get_output((f.txid, 0)).state == "unspent"  # type: ignore[union-attr]
    assert store.get(f.txid).spent_utxos == 0
    assert store.unspend([s]) == [None]  # nothing left to clear
    assert store.get(f.txid).spent_utxos == 0
    store.spend(child((f, 0), fee=7), 101)  # spendable again by anyone
    missing = store.unspend([s._replace(txid=b"\x43" * 32), s._replace(vout=5)])
    assert isinstance(missing[0], TxNotFound) and isinstance(missing[1], UtxoNotFound)


def test_freeze_refuses_spent_and_mismatched(store: UtxoStore) -> None:
    f = funding(2)
    created(store, f)
    store.spend(child((f, 0)), 101)
    r = store.freeze(
        [((f.txid, 0), uhash(f, 0)), ((f.txid, 1), b"\x00" * 32), ((b"\x01" * 32, 0), b"\x00" * 32)]
    )
    assert isinstance(r[0], UtxoSpent)
    assert isinstance(r[1], UtxoMismatch)
    assert isinstance(r[2], TxNotFound)
    assert store.get_output((f.txid, 1)).state == "unspent"  # type: ignore[union-attr]


def test_reassign_needs_a_frozen_output(store: UtxoStore) -> None:
    from stores.utxo import UtxoNotFrozen

    f = funding(1)
    created(store, f)
    store.set_block_height(300)
    with pytest.raises(UtxoNotFrozen):
        store.reassign((f.txid, 0), uhash(f, 0), b"\x07" * 32)
    store.freeze([((f.txid, 0), uhash(f, 0))])
    store.reassign((f.txid, 0), uhash(f, 0), b"\x07" * 32)
    out = store.get_output((f.txid, 0))
    assert out is not None and out.utxo_hash == b"\x07" * 32 and out.spendable_in == 1300
    assert not out.frozen
    (entry,) = store.get(f.txid).reassignments
    assert entry["offset"] == 0 and entry["block_height"] == 300


def test_reassign_refuses_a_malformed_hash(store: UtxoStore) -> None:
    from stores.utxo import ProcessingError

    f = funding(3)
    created(store, f)
    store.set_block_height(300)
    store.freeze([((f.txid, 0), uhash(f, 0))])
    for bad in (b"\x07" * 33, b"\x07" * 31, b"\x00" * 32):
        with pytest.raises(ProcessingError):
            store.reassign((f.txid, 0), uhash(f, 0), bad)
    assert store.get_output((f.txid, 1)).utxo_hash == uhash(f, 1)  # type: ignore[union-attr]
    assert store.get_output((f.txid, 2)).state == "unspent"  # type: ignore[union-attr]


def test_batch_double_spend_keeps_the_first_and_counts_once(store: UtxoStore) -> None:
    f = funding(2)
    created(store, f)
    a, b, c = child((f, 0), fee=100), child((f, 0), fee=200), child((f, 1), fee=300)
    ra, rb, rc = store.spend_many([a, b, c], 101)
    assert isinstance(ra, list) and isinstance(rb, SpendRejected) and isinstance(rc, list)
    assert store.get_output((f.txid, 0)).spending_txid == a.txid  # type: ignore[union-attr]
    assert store.get(f.txid).spent_utxos == 2


def test_a_rejected_tx_frees_its_output_for_a_later_one_in_the_batch(store: UtxoStore) -> None:
    f = funding(1)
    created(store, f)
    bad = child((f, 0), (funding(1), 0))  # its second parent is unknown
    good = child((f, 0), fee=900)
    rbad, rgood = store.spend_many([bad, good], 101)
    assert isinstance(rbad, SpendRejected) and isinstance(rgood, list)
    assert store.get_output((f.txid, 0)).spending_txid == good.txid  # type: ignore[union-attr]


@pytest.mark.parametrize("rounds", range(4))  # (an unordered batch: both orders, most likely)
def test_a_refused_spend_leaves_no_delete_at_height_on_a_record_it_no_longer_fills(
    store: UtxoStore, rounds: int
) -> None:
    """Of two spends of one mined record's two outputs in one call, the one refused for another
    parent takes its output back: the record is not all spent, so it has no delete-at-height,
    whichever of the two reached the record first."""
    store.set_block_height(100)
    f = funding(2)
    created(store, f, mined=True)
    bad = child((f, 0), (funding(1), 0))  # its second parent is unknown
    good = child((f, 1))
    rbad, rgood = store.spend_many([bad, good], 101)
    assert isinstance(rbad, SpendRejected) and isinstance(rgood, list)
    meta = store.get(f.txid)
    assert (meta.spent_utxos, meta.delete_at_height) == (1, None)
    assert store.get_output((f.txid, 0)).spending_txid is None  # type: ignore[union-attr]


def test_rule_order_after_the_parent_checks(store: UtxoStore) -> None:
    from chain import utxo_hash

    store.set_block_height(100)
    cb = coinbase(100)
    store.create(cb, 100, [BlockInfo(1, 100)])
    # immature is reported before a missing output
    ghost = build_tx([TxIn(cb.txid, 7, b"\x51", 0xFFFFFFFF, 1, b"\x51")], [(1, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(ghost, 150)
    assert isinstance(_only(e.value), TxCoinbaseImmature)
    # a hash mismatch is reported before frozen-until
    f = funding(1)
    created(store, f)
    store.freeze([((f.txid, 0), uhash(f, 0))])
    new_script = script()
    value = f.outputs[0].satoshis
    store.reassign((f.txid, 0), uhash(f, 0), utxo_hash(f.txid, 0, new_script, value))
    wrong = build_tx([TxIn(f.txid, 0, b"\x51", 0xFFFFFFFF, value, script())], [(1, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(wrong, 150)
    assert isinstance(_only(e.value), UtxoMismatch)
    # frozen-until is reported even to the spender that will own it
    right = build_tx([TxIn(f.txid, 0, b"\x51", 0xFFFFFFFF, value, new_script)], [(1, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(right, 150)
    assert isinstance(_only(e.value), UtxoFrozen)


def test_spenders_reads_each_outputs_spender_alone(store: UtxoStore) -> None:
    """`spenders`: the spender of each outpoint held (None: unspent or frozen); an outpoint of
    a tx not in the store, or past its outputs, is left out."""
    f = funding(4)
    created(store, f)
    a, b = child((f, 0)), child((f, 2))
    store.spend_many([a, b], 101)
    assert store.freeze([((f.txid, 3), uhash(f, 3))]) == [None]
    absent = funding()
    ops = [(f.txid, v) for v in range(5)] + [(absent.txid, 0)]
    assert store.spenders(ops) == {
        (f.txid, 0): a.txid, (f.txid, 1): None, (f.txid, 2): b.txid, (f.txid, 3): None
    }
    assert store.spenders([]) == {}
    assert store.spenders(ops).conflicting == frozenset()


def test_spenders_names_the_parents_that_are_conflicting(store: UtxoStore) -> None:
    """`spenders` reads each parent's conflicting flag with its slots (a mempool tx checking its
    inputs learns both in one read): a conflicting parent is named whether the outpoint asked
    for is spent or not; a parent not in the store is not, nor one asked for only with an
    outpoint it does not have."""
    f, g = funding(2), funding(1)
    created(store, f, g)
    a = child((f, 0))
    store.spend_many([a], 101)
    store.set_conflicting([f.txid], True)
    ops = [(f.txid, 0), (f.txid, 1), (g.txid, 0), (funding().txid, 0), (g.txid, 5)]
    got = store.spenders(ops)
    assert got == {(f.txid, 0): a.txid, (f.txid, 1): None, (g.txid, 0): None}
    assert got.conflicting == {f.txid}
    assert store.spenders([(f.txid, 7)]).conflicting == frozenset()  # (past its outputs)
    assert "conflicting" in repr(got)
    store.set_conflicting([f.txid], False)
    assert store.spenders(ops).conflicting == frozenset()



def test_take_back_dead_frees_only_what_a_tx_with_no_record_holds(store: UtxoStore) -> None:
    """An attempt of t died holding f:0 alone (its spend of g:0 undone here, as a refusal on
    that parent would); t has no record. `take_back_dead(t)` frees f:0 — counts, delete-at-
    height and script index as an unspend leaves them — and leaves g:0, which another holds."""
    from hashlib import sha256

    f, g = funding(2), funding(2)
    created(store, f, g)
    t = child((f, 0), (g, 0))
    (spent,) = store.spend_many([t], 101)
    assert isinstance(spent, list)
    (back,) = store.unspend([s for s in spent if s.txid == g.txid])
    assert back is None
    other = child((g, 0))
    store.spend(other, 101)
    assert store.spenders([(f.txid, 0), (g.txid, 0)]) == {(f.txid, 0): t.txid, (g.txid, 0): other.txid}
    assert store.take_back_dead(t) == 1
    assert store.spenders([(f.txid, 0), (g.txid, 0)]) == {(f.txid, 0): None, (g.txid, 0): other.txid}
    assert store.get(f.txid).spent_utxos == 0
    items, _after = store.script_utxos(sha256(f.outputs[0].script).digest())
    assert [(i.utxo.txid, i.utxo.vout) for i in items] == [(f.txid, 0)]
    assert store.take_back_dead(t) == 0  # again: nothing of it left
    assert store.spend(child((f, 0)), 101)  # the output is anyone's again


def test_take_back_dead_leaves_a_tx_with_a_record_alone(store: UtxoStore) -> None:
    f = funding(2)
    created(store, f)
    t = child((f, 0), (f, 1))
    created(store, t)
    store.spend(t, 101)
    assert store.take_back_dead(t) == 0
    assert store.spenders([(f.txid, 0), (f.txid, 1)]) == {(f.txid, 0): t.txid, (f.txid, 1): t.txid}
    assert store.take_back_dead(funding()) == 0  # parents unknown: nothing to free


def test_an_exact_unspend_frees_only_the_spender_it_names(store: UtxoStore) -> None:
    """`unspend(exact=True)`: a spend is taken back only while its slot still holds the spender
    and vin it names; a slot another holds now (freed and taken meanwhile) stays theirs."""
    f = funding(2)
    created(store, f)
    a, b = child((f, 0)), child((f, 1))
    (sa,) = store.spend(a, 101)
    (sb,) = store.spend(b, 101)
    stale = Spend(sb.txid, sb.vout, sb.utxo_hash, a.txid, 0)  # names a, but b holds it
    assert store.unspend([stale, sa], exact=True) == [None, None]
    assert store.spenders([(f.txid, 0), (f.txid, 1)]) == {(f.txid, 0): None, (f.txid, 1): b.txid}
    assert store.get(f.txid).spent_utxos == 1


def test_a_pruned_spenders_spend_is_never_taken_back(store: UtxoStore) -> None:
    """kid spent p:0, was mined, spent whole and pruned: p lists it among its deleted children.
    Its spend there stands for good: neither `take_back_dead` (a replay of kid, which has no
    record now) nor an exact unspend naming it frees p:0 (found by review: a replayed kid,
    refused, freed p:0 for a double spend)."""
    p = funding(3)
    store.set_block_height(100)
    created(store, p, mined=True)
    kid = child((p, 0))
    store.spend(kid, 101)
    created(store, kid, height=101, mined=True)
    store.spend(child((kid, 0)), 102)
    dah = store.get(kid.txid).delete_at_height
    assert dah is not None and store.delete_expired([kid.txid], dah) == 1
    assert kid.txid in store.get(p.txid).deleted_children
    assert store.take_back_dead(kid) == 0
    assert store.unspend([Spend(p.txid, 0, uhash(p, 0), kid.txid, 0)], exact=True) == [None]
    assert store.spenders([(p.txid, 0)]) == {(p.txid, 0): kid.txid}
