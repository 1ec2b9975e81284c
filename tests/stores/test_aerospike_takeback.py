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
