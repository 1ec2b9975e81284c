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
from tests.aerospike_server import fresh_store, needs_aerospike
from tests.stores.helpers import child, created, funding

pytestmark = needs_aerospike


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    yield from fresh_store(4, f"file://{tmp_path}/blobs", height=100)


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
    from stores.utxo.aerospike.rules import mine, packed, spend_result
    from stores.utxo.kernel.spend import expected_hash

    one, twin = funding(1), funding(1)
    created(store, one, twin, mined=True)
    spender = child((one, 0))
    key, slot = store.rules.where((one.txid, 0))
    args = [packed([(0, slot, (one.txid, 0), expected_hash(spender, 0))]), spender.txid, 101, 0, 0, 101, 288]
    res = spend_result(store.conn.apply(key, "spend", args))
    assert store.get(one.txid).delete_at_height is not None  # all spent and mined: due
    store.set_conflicting([one.txid, twin.txid], True)
    undo = [[[slot, mine(spender.txid, 0)]], res.get("dah_was"), res.get("dah"), 101, 288, res.get("gen")]
    assert store.conn.apply(key, "take_back", undo)["n"] == 1
    got, want = store.get(one.txid), store.get(twin.txid)
    assert got.spent_utxos == want.spent_utxos == 0
    assert want.delete_at_height is not None and got.delete_at_height is not None
    assert want.delete_at_height <= got.delete_at_height <= want.delete_at_height + 1
