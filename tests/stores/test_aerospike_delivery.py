"""On Aerospike a transaction's spend is one call per parent record: a delivery that died between
them (or before its take-back) left spends naming a transaction with no record. A delivery
that runs alone (`delivering`, stores/utxo/aerospike/delivery.py) takes those back when it is
refused, and puts them back if the transaction's record appears meanwhile (a block). Checked
against what the slots hold after, read through the store's own `get_spend`. Needs
AEROSPIKE_HOSTS."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chain import Tx
from stores.errors import StorageError
from stores.utxo import SpendRejected, SpendStatus
from stores.utxo.aerospike.rules import mine
from stores.utxo.kernel.spend import expected_hash
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.stores.helpers import child, created, funding, uhash
from workers.mempool import apply_tx

pytestmark = needs_aerospike
HEIGHT = 100


@pytest.fixture
def url() -> Iterator[str]:
    u = new_url()
    yield u
    drop_set(None, u)


@pytest.fixture
def store(url: str, tmp_path: Path) -> Iterator[Any]:
    from stores.utxo import open_utxo_store

    s = open_utxo_store(url, retention=288, batch_size=4, blob_url=f"file://{tmp_path}/blobs")
    s.set_block_height(HEIGHT)
    yield s
    s.close()


def half_spent(store: Any, tx: Tx, vin: int) -> None:
    """What a delivery of `tx` that died leaves: input `vin` spent for it, nothing else."""
    i = tx.inputs[vin]
    key, slot = store.rules.where((i.prev_txid, i.prev_vout))
    args = [[[slot, i.prev_vout, expected_hash(tx, vin), vin]], tx.txid, HEIGHT + 1, 0, 0, HEIGHT + 1, 288]
    assert store.conn.apply(key, "spend", args)["fresh"] == [0]


def spender(store: Any, parent: Tx, vout: int) -> bytes | None:
    info = store.get_spend((parent.txid, vout), uhash(parent, vout))
    return info.spending_txid if info.status is SpendStatus.SPENT else None


def lease(store: Any, tx: Tx) -> dict[str, Any] | None:
    held = store._lease_bins(tx.txid)
    return None if held is None else held[0]


def double_spent(store: Any) -> tuple[Tx, Tx, Tx, Tx]:
    """Two parents; `tx` spends an output of each; a rival holds the second one."""
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2)
    tx, rival = child((p1, 0), (p2, 0)), child((p2, 0))
    assert apply_tx(store, rival) is True
    return p1, p2, tx, rival


def test_a_refused_delivery_takes_back_what_a_dead_one_spent(store: Any) -> None:
    p1, p2, tx, rival = double_spent(store)
    half_spent(store, tx, 0)  # the dead delivery got as far as the first parent
    assert spender(store, p1, 0) == tx.txid
    refused = apply_tx(store, tx)
    assert isinstance(refused, SpendRejected) and [v for v, _e in refused.errors] == [1]
    assert spender(store, p1, 0) is None  # free again (without the lease: spent by tx for ever)
    assert spender(store, p2, 0) == rival.txid  # the rival's stays
    assert store.get(p1.txid).spent_utxos == 0
    assert lease(store, tx) is None  # released
    # the output is anyone's again
    other = child((p1, 0))
    assert apply_tx(store, other) is True and spender(store, p1, 0) == other.txid


def test_outside_a_delivery_a_refusal_leaves_an_earlier_attempts_spends(store: Any) -> None:
    """Without the lease a refused spend cannot tell a dead attempt's spends from those of a
    delivery beside it, and leaves them (the reason every mempool delivery takes the lease)."""
    p1, _p2, tx, _rival = double_spent(store)
    half_spent(store, tx, 0)
    (refused,) = store.spend_many([tx], HEIGHT + 1)
    assert isinstance(refused, SpendRejected)
    assert spender(store, p1, 0) == tx.txid


def test_a_new_spend_of_a_refused_delivery_is_taken_back_as_ever(store: Any) -> None:
    p1, _p2, tx, _rival = double_spent(store)
    assert isinstance(apply_tx(store, tx), SpendRejected)
    assert spender(store, p1, 0) is None and store.get(p1.txid).spent_utxos == 0


def test_a_delivery_waits_while_another_live_one_holds_the_transaction(
    store: Any, url: str, tmp_path: Path
) -> None:
    from stores.utxo import open_utxo_store

    p1, p2 = funding(1), funding(1)
    created(store, p1, p2)
    tx = child((p1, 0), (p2, 0))
    other = open_utxo_store(url, retention=288, batch_size=4, blob_url=f"file://{tmp_path}/blobs")
    try:
        with store.delivering(tx):
            assert lease(store, tx) is not None
            with pytest.raises(StorageError, match=r"is being applied by .*try again later"):
                with other.delivering(tx):
                    pass
        assert lease(store, tx) is None
        other.set_block_height(HEIGHT)
        assert apply_tx(other, tx) is True
        assert (spender(store, p1, 0), spender(store, p2, 0)) == (tx.txid, tx.txid)
    finally:
        other.close()


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize(
    "holder,expires_in_s,taken",
    [
        (f"{socket.gethostname()}:{{dead}}:x", 600, True),  # a process of this host that is gone
        ("another-host:1:x", -1, True),  # expired
        ("another-host:1:x", 600, False),  # live elsewhere: only waited out
    ],
)
def test_a_lapsed_lease_is_taken_over(store: Any, holder: str, expires_in_s: int, taken: bool) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2)
    tx = child((p1, 0), (p2, 0))
    bins = {"holder": holder.format(dead=dead_pid()), "expiresAt": int((time.time() + expires_in_s) * 1000)}
    assert store._create_only([(store._lease_key(tx.txid), bins)], ttl=1200) == [True]
    if taken:
        assert apply_tx(store, tx) is True
        assert lease(store, tx) is None
    else:
        with pytest.raises(StorageError, match="another-host:1:x"):
            apply_tx(store, tx)
        assert spender(store, p1, 0) is None  # nothing done


def test_a_transaction_in_one_record_needs_no_lease(store: Any) -> None:
    p = funding(2)
    created(store, p)
    tx = child((p, 0), (p, 1))
    with store.delivering(tx):
        assert lease(store, tx) is None
    assert apply_tx(store, tx) is True


def test_a_record_made_while_a_refused_delivery_takes_back_gets_its_spends_back(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A block makes the transaction (mined) while a refused delivery of it takes back: the
    delivery looks again, finds the record, and spends again what it had taken back. (The
    rival's output cannot be put back: logged, for the block's own spend to settle.)"""
    p1, p2, tx, rival = double_spent(store)
    half_spent(store, tx, 0)
    conn = store.rules.conn
    real = conn.apply

    def apply(key: Any, function: str, args: list[Any]) -> Any:
        out = real(key, function, args)
        if function == "take_back" and args[0][0][1] == mine(tx.txid, 0):
            created(store, tx, mined=True)  # the block's create, just after the take-back
        return out

    conn.apply = apply
    try:
        with caplog.at_level(logging.ERROR, "utxoflow.store"):
            assert isinstance(apply_tx(store, tx), SpendRejected)
    finally:
        conn.apply = real
    assert spender(store, p1, 0) == tx.txid  # put back
    assert spender(store, p2, 0) == rival.txid
    assert store.get(tx.txid).block_ids == [1]
    assert any("could not all be put back" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("locked", [False, True])
def test_a_replay_of_a_pruned_transaction_takes_nothing_back(store: Any, locked: bool) -> None:
    """A transaction pruned (its record gone, each parent that stays listing it as a deleted
    child) delivered again has no record and slots that name it: they are its mined spends, not
    a dead attempt's, and stay — also where a parent refuses it for another reason first (locked)."""
    p1, p2 = funding(2), funding(2)
    created(store, p1, p2, mined=True)
    tx = child((p1, 0), (p2, 0))
    assert apply_tx(store, tx) is True
    for p in (p1, p2):
        assert store.rules.add_child(p.txid, "deleted", tx.txid) is True
    store.delete_txs([tx.txid])
    if locked:
        store.set_locked([p1.txid], True)
    refused = apply_tx(store, tx)
    assert isinstance(refused, SpendRejected)
    if locked:
        store.set_locked([p1.txid], False)  # (a locked record's outputs read as LOCKED)
    assert (spender(store, p1, 0), spender(store, p2, 0)) == (tx.txid, tx.txid)
    assert (store.get(p1.txid).spent_utxos, store.get(p2.txid).spent_utxos) == (1, 1)
