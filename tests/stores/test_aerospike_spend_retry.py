"""A transaction's spend across several parent records is all or nothing on Aerospike, which
has no multi-record transaction: a process that dies between its per-record calls leaves the
spends of the calls it made. The attempt delivered again finds them its own ("same spender
again"); if that attempt is then refused for good (another transaction took an output
meanwhile), it takes those back too, as it does its own new spends — while a refusal that may
pass (a parent not there yet) keeps them, for the attempt after it. Needs AEROSPIKE_HOSTS."""

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


def test_a_retry_refused_for_good_takes_back_what_a_dead_attempt_spent(store: Any) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2)
    tx = child((p1, 0), (p2, 0))
    first_call_only(store, tx)
    assert status(store, p1, 0) is SpendStatus.SPENT
    rival = child((p2, 0))
    store.spend(rival, HEIGHT + 1)  # takes the other output meanwhile
    with pytest.raises(SpendRejected) as e:
        store.spend(tx, HEIGHT + 1)
    assert isinstance(e.value.first, UtxoSpent)
    assert status(store, p1, 0) is SpendStatus.OK  # the dead attempt's spend is gone too
    assert store.get(p1.txid).spent_utxos == 0 and store.get(p1.txid).delete_at_height is None
    assert store.spend(child((p1, 0)), HEIGHT + 1)  # and the output is spendable by another


def test_a_retry_that_may_pass_later_keeps_what_a_dead_attempt_spent(store: Any) -> None:
    p1, later = funding(1), funding(1)
    created(store, p1)
    tx = child((p1, 0), (later, 0))
    first_call_only(store, tx)
    with pytest.raises(SpendRejected) as e:
        store.spend(tx, HEIGHT + 1)
    assert isinstance(e.value.first, TxNotFound)
    assert status(store, p1, 0) is SpendStatus.SPENT  # kept: the next attempt may go through
    created(store, later)
    spends = store.spend(tx, HEIGHT + 1)
    assert [(s.txid, s.spending_vin) for s in spends] == [(p1.txid, 0), (later.txid, 1)]
    info = store.get_spend((p1.txid, 0), uhash(p1, 0))
    assert (info.spending_txid, info.spending_vin) == (tx.txid, 0)


def test_a_fully_spent_record_of_a_dead_attempt_gets_its_delete_height_back_off(store: Any) -> None:
    """The dead attempt spent the parent's last output, so the parent became due for pruning;
    taking the spend back makes it not due again."""
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    tx = child((p1, 0), (p2, 0))
    first_call_only(store, tx)
    assert store.get(p1.txid).delete_at_height is not None
    store.spend(child((p2, 0)), HEIGHT + 1)
    with pytest.raises(SpendRejected):
        store.spend(tx, HEIGHT + 1)
    assert store.get(p1.txid).delete_at_height is None
