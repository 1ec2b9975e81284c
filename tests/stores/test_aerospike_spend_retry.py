"""A transaction's spend across several parent records is all or nothing on Aerospike, which
has no multi-record transaction, by taking back — but a process that dies between its
per-record calls leaves the spends of the calls it made, and the attempt delivered again finds
them its own ("same spender again"). When that attempt is refused for good, whoever learns it
(the tx task, the recovery manager) frees them (`workers.mempool.release_leftovers`); a refusal
that may pass keeps them for the attempt after it. Needs AEROSPIKE_HOSTS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chain import Tx
from stores.utxo import SpendRejected, SpendStatus, TxNotFound, UtxoSpent
from stores.utxo.kernel.spend import expected_hash
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.stores.helpers import child, created, funding, uhash
from workers.mempool import apply_tx, release_leftovers, waiting_for_parents

pytestmark = needs_aerospike
HEIGHT = 100


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    from stores.utxo import open_utxo_store

    url = new_url()
    s = open_utxo_store(url, retention=288, batch_size=4, blob_url=f"file://{tmp_path}/blobs")
    s.set_block_height(HEIGHT)
    yield s
    drop_set(None, url)
    s.close()


def first_call_only(store: Any, tx: Tx) -> None:
    """What a process that died after its first per-record call left: input 0 spent, alone."""
    i = tx.inputs[0]
    key, slot = store.rules.where((i.prev_txid, i.prev_vout))
    args = [[[slot, i.prev_vout, expected_hash(tx, 0), 0]], tx.txid, HEIGHT + 1, 0, 0, HEIGHT + 1, 288]
    res = store.conn.apply(key, "spend", args)
    assert list(res["fresh"]) == [0], res


def status(store: Any, t: Tx, v: int) -> SpendStatus:
    return store.get_spend((t.txid, v), uhash(t, v)).status  # type: ignore[no-any-return]


def test_a_tx_refused_for_good_frees_what_a_dead_attempt_spent(store: Any) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    tx = child((p1, 0), (p2, 0))
    first_call_only(store, tx)
    assert status(store, p1, 0) is SpendStatus.SPENT
    assert store.get(p1.txid).delete_at_height is not None  # all spent, mined: due later
    store.spend(child((p2, 0)), HEIGHT + 1)  # another takes the other output meanwhile
    refused = apply_tx(store, tx)
    assert isinstance(refused, SpendRejected) and isinstance(refused.first, UtxoSpent)
    assert not waiting_for_parents(refused)
    assert status(store, p1, 0) is SpendStatus.SPENT  # the store keeps it: it cannot tell
    assert release_leftovers(store, tx) == 1
    assert status(store, p1, 0) is SpendStatus.OK
    meta = store.get(p1.txid)
    assert meta.spent_utxos == 0 and meta.delete_at_height is None
    assert release_leftovers(store, tx) == 0  # nothing more is its own
    assert store.spend(child((p1, 0)), HEIGHT + 1)  # spendable by another again


def test_what_another_spent_is_never_freed(store: Any) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2)
    tx = child((p1, 0), (p2, 0))
    store.spend(child((p1, 0)), HEIGHT + 1)
    store.spend(child((p2, 0)), HEIGHT + 1)
    assert isinstance(apply_tx(store, tx), SpendRejected)
    assert release_leftovers(store, tx) == 0
    assert status(store, p1, 0) is status(store, p2, 0) is SpendStatus.SPENT


def test_a_refusal_that_may_pass_keeps_what_a_dead_attempt_spent(store: Any) -> None:
    p1, later = funding(1), funding(1)
    created(store, p1)
    tx = child((p1, 0), (later, 0))
    first_call_only(store, tx)
    refused = apply_tx(store, tx)
    assert isinstance(refused, SpendRejected) and isinstance(refused.first, TxNotFound)
    assert waiting_for_parents(refused)  # (so neither its task nor the manager frees anything)
    assert status(store, p1, 0) is SpendStatus.SPENT
    created(store, later)
    assert apply_tx(store, tx) is None  # the attempt after it completes the set
    info = store.get_spend((p1.txid, 0), uhash(p1, 0))
    assert (info.spending_txid, info.spending_vin) == (tx.txid, 0)
    assert store.get(tx.txid).txid == tx.txid
