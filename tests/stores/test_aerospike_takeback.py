"""A batch of spends on Aerospike runs several calls on one record; when one transaction of the
batch is refused by another of its parents, its new spends there are taken back. The record's
delete-at-height goes back to what it was only if nothing else changed the record since; when
another call of the batch spent there after it, the rule settles it again (the kernel: the
refused transaction never happened). Found by the Lua parity suite; needs AEROSPIKE_HOSTS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stores.utxo import SpendRejected
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.stores.helpers import child, created, funding

pytestmark = needs_aerospike


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    from stores.utxo import open_utxo_store

    url = new_url()
    s = open_utxo_store(url, retention=288, batch_size=4, blob_url=f"file://{tmp_path}/blobs")
    s.set_block_height(100)
    yield s
    drop_set(None, url)
    s.close()


def test_a_take_back_after_another_spend_of_the_batch_settles_the_delete_height_again(store: Any) -> None:
    parent = funding(3)
    created(store, parent)  # unmined: the rule gives it no delete-at-height while unspent
    store.conn.client.put(store.key(parent.txid), {"deleteAtHeight": 95})  # as it stood before
    refused = child((parent, 0), (funding(1), 0))  # its other parent is not in the store
    other = child((parent, 1))
    got = store.spend_many([refused, other], 101)
    assert isinstance(got[0], SpendRejected) and not isinstance(got[1], Exception)
    meta = store.get(parent.txid)
    assert meta.spent_utxos == 1
    # as if `refused` had never run: `other`'s spend settled it (unmined, not all spent: none)
    assert meta.delete_at_height is None


def test_a_take_back_after_a_state_change_settles_the_delete_height_again(store: Any) -> None:
    """A spend makes a mined record all spent (due at height + retention); it is then made
    conflicting; the spend is taken back. The record must end due as its twin that only was
    made conflicting is — not with the delete height from before the spend (none: never
    pruned). (The rule settles it at the take-back's height, a block after the twin's: due no
    sooner than the kernel would have it, which is the side to err on.)"""
    from stores.utxo.aerospike.rules import mine
    from stores.utxo.kernel.spend import expected_hash

    one, twin = funding(1), funding(1)
    created(store, one, twin, mined=True)
    spender = child((one, 0))
    key, slot = store.rules.where((one.txid, 0))
    args = [[[slot, 0, expected_hash(spender, 0), 0]], spender.txid, 101, 0, 0, 101, 288]
    res = store.conn.apply(key, "spend", args)
    assert store.get(one.txid).delete_at_height is not None  # all spent and mined: due
    store.set_conflicting([one.txid, twin.txid], True)
    undo = [[[slot, mine(spender.txid, 0)]], res.get("dah_was"), res.get("dah"), 101, 288, res.get("gen")]
    assert store.conn.apply(key, "take_back", undo)["n"] == 1
    got, want = store.get(one.txid), store.get(twin.txid)
    assert got.spent_utxos == want.spent_utxos == 0
    assert want.delete_at_height is not None and got.delete_at_height is not None
    assert want.delete_at_height <= got.delete_at_height <= want.delete_at_height + 1


def _dead_attempt(store: Any, tx: Any, vin: int) -> None:
    """What an attempt to spend `tx` that died after its call on input `vin`'s parent left:
    that one input spent by `tx`, nothing else (the call the spend makes, made alone)."""
    from stores.utxo.kernel.spend import expected_hash

    i = tx.inputs[vin]
    key, slot = store.rules.where((i.prev_txid, i.prev_vout))
    res = store.conn.apply(key, "spend", [[[slot, i.prev_vout, expected_hash(tx, vin), vin]], tx.txid,
                                          101, 0, 0, 101, 288])  # fmt: skip
    assert res.get("fresh"), res


def test_a_refused_attempt_frees_what_a_dead_attempt_of_the_same_tx_spent(store: Any) -> None:
    """The crash window: an attempt spent the first parent's output and died; meanwhile another
    tx took the second. The attempt delivered again is refused; the tx has no record (a mempool
    tx is spent before it is made), so the first output must be free again, not held by a
    spend that will never be."""
    a, b = funding(2), funding(2)
    created(store, a, b)
    tx = child((a, 0), (b, 0))
    _dead_attempt(store, tx, 0)
    assert store.get_output((a.txid, 0)).spending_txid == tx.txid
    rival = child((b, 0))
    assert not isinstance(store.spend_many([rival], 101)[0], Exception)
    (again,) = store.spend_many([tx], 101)
    assert isinstance(again, SpendRejected)
    assert store.get_output((a.txid, 0)).spending_txid is None  # free for anyone again
    assert store.get(a.txid).spent_utxos == 0
    assert store.get_output((b.txid, 0)).spending_txid == rival.txid  # the rival's stays
    taker = child((a, 0))
    assert not isinstance(store.spend_many([taker], 101)[0], Exception)


def test_a_refused_tx_with_its_own_record_keeps_its_spends(store: Any) -> None:
    """A tx that has a record was accepted whole (or is a block's, whose undo takes back its
    spends): a later refusal of it frees nothing. Here it was spent and made; then its second
    parent is gone and its record is conflicting (so it does not vouch for the gone parent),
    and a second delivery is refused: the first parent's output stays spent by it."""
    a, b = funding(2), funding(2)
    created(store, a, b)
    tx = child((a, 0), (b, 0))
    assert not isinstance(store.spend_many([tx], 101)[0], Exception)
    created(store, tx)
    store.set_conflicting([tx.txid], True)  # no blessing: its spends were to be taken back by others
    store.conn.client.remove(store.key(b.txid))  # the second parent gone
    (again,) = store.spend_many([tx], 101)
    assert isinstance(again, SpendRejected)
    assert store.get_output((a.txid, 0)).spending_txid == tx.txid  # kept: it has its record


def test_a_dead_attempt_freed_beside_a_spend_that_goes_through(store: Any) -> None:
    """In one call: a refused tx with a dead attempt's spend (freed), beside a tx that spends
    alone (kept) — the release touches only what names the refused one."""
    a, b, c = funding(2), funding(2), funding(2)
    created(store, a, b, c)
    dead = child((a, 0), (b, 0))
    _dead_attempt(store, dead, 0)
    assert not isinstance(store.spend_many([child((b, 0))], 101)[0], Exception)
    fine = child((a, 1), (c, 0))
    got = store.spend_many([dead, fine], 101)
    assert isinstance(got[0], SpendRejected) and isinstance(got[1], list)
    assert store.get_output((a.txid, 0)).spending_txid is None
    assert store.get_output((a.txid, 1)).spending_txid == fine.txid
    assert store.get(a.txid).spent_utxos == 1


def test_a_dead_attempt_waiting_for_a_parent_keeps_its_spend_and_then_goes_through(store: Any) -> None:
    """A refusal that may pass (a parent not in the store yet) frees nothing: the tx's next
    delivery, once the parent is there, goes through whole."""
    a, b = funding(2), funding(2)
    created(store, a)
    tx = child((a, 0), (b, 0))
    _dead_attempt(store, tx, 0)
    (waiting,) = store.spend_many([tx], 101)
    assert isinstance(waiting, SpendRejected)
    assert store.get_output((a.txid, 0)).spending_txid == tx.txid
    created(store, b)
    (done,) = store.spend_many([tx], 101)
    assert isinstance(done, list)
    assert sorted((s.txid, s.vout) for s in done) == sorted([(a.txid, 0), (b.txid, 0)])
