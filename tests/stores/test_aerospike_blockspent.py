"""A block's spends on Aerospike are marked on their slots (`blockSpent`), and a delivery's
take-back leaves a marked slot spent: there is no transaction across the records of one spend,
so a refused delivery of a transaction can take back its new spends after a block spent for the
same transaction, and without the mark that freed an input of the mined one (found by review).
The block call's own take-back and an unspend revert a marked slot and clear its mark. Needs
AEROSPIKE_HOSTS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chain import Tx
from stores.utxo import SpendRejected
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.stores.helpers import child, created, funding, uhash
from workers.conflicts import BLOCK_SPEND

pytestmark = needs_aerospike
HEIGHT = 101


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    from stores.utxo import open_utxo_store

    url = new_url()
    s = open_utxo_store(url, retention=288, batch_size=32, blob_url=f"file://{tmp_path}/blobs")
    s.set_block_height(100)
    yield s
    drop_set(None, url)
    s.close()


def marks(store: Any, tx: Tx) -> bytes | None:
    """The `blockSpent` bitmap of `tx`'s master record (None: no slot marked)."""
    _k, _m, bins = store.conn.client.get(store.key(tx.txid))
    value = bins.get("blockSpent")
    return None if value is None else bytes(value)


def spender_of(store: Any, tx: Tx, vout: int) -> bytes | None:
    (out,) = store.get_outputs([(tx.txid, vout)]).values()
    spender: bytes | None = out.spending_txid
    return spender


def block_lands_before_take_back(store: Any, monkeypatch: pytest.MonkeyPatch, tx: Tx, by_block: bool) -> None:
    """Make the store's next take-back wait for a block's spend of `tx` (run just before it)."""
    real = store.conn.apply_many

    def apply_many(calls: list[Any]) -> list[Any]:
        if calls and calls[0][1] == "take_back":
            monkeypatch.setattr(store.conn, "apply_many", real)
            (r,) = store.spend_many([tx], HEIGHT, ignore=BLOCK_SPEND, by_block=by_block)
            assert not isinstance(r, Exception), r
        return real(calls)

    monkeypatch.setattr(store.conn, "apply_many", apply_many)


@pytest.mark.parametrize("by_block", [True, False], ids=["marked", "unmarked (the race)"])
def test_a_refused_delivery_cannot_free_an_input_a_block_spent_meanwhile(
    store: Any, monkeypatch: pytest.MonkeyPatch, by_block: bool
) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    store.set_locked([p2.txid], True)  # a delivery is refused there; a block's spend is not
    tx = child((p1, 0), (p2, 0))
    block_lands_before_take_back(store, monkeypatch, tx, by_block)
    (got,) = store.spend_many([tx], HEIGHT)  # the delivery: spends p1, refused by p2
    assert isinstance(got, SpendRejected)
    assert spender_of(store, p2, 0) == tx.txid
    if by_block:  # the block's spend stands whole
        assert spender_of(store, p1, 0) == tx.txid
        assert store.get(p1.txid).spent_utxos == 1
    else:  # what the block's spend risked before the mark: its input freed under it
        assert spender_of(store, p1, 0) is None


def test_a_block_calls_own_take_back_reverts_and_unmarks(store: Any) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    assert store.freeze([((p2.txid, 0), uhash(p2, 0))]) == [None]
    tx = child((p1, 0), (p2, 0))
    (got,) = store.spend_many([tx], HEIGHT, ignore=BLOCK_SPEND, by_block=True)
    assert isinstance(got, SpendRejected)  # frozen refuses a block too
    assert spender_of(store, p1, 0) is None and marks(store, p1) is None
    # and a delivery refused the same way takes its own spend back (no mark left to stop it)
    (got,) = store.spend_many([child((p1, 0), (p2, 0))], HEIGHT)
    assert isinstance(got, SpendRejected) and spender_of(store, p1, 0) is None


def test_marks_follow_the_slots_and_an_unspend_clears_them(store: Any) -> None:
    parent = funding(20)
    created(store, parent, mined=True)
    tx = child((parent, 3), (parent, 9), (parent, 17))
    (spends,) = store.spend_many([tx], HEIGHT, ignore=BLOCK_SPEND, by_block=True)
    assert isinstance(spends, list)
    assert marks(store, parent) == bytes([1 << 3, 1 << 1, 1 << 1])  # slot k: byte k // 8, bit k % 8
    assert store.unspend([s for s in spends if s.vout == 17]) == [None]
    assert marks(store, parent) == bytes([1 << 3, 1 << 1])  # (no trailing empty byte)
    # a spend the delivery made first, then found by the block, is marked too (not fresh there)
    other = child((parent, 5))
    assert isinstance(store.spend_many([other], HEIGHT)[0], list)
    assert marks(store, parent) == bytes([1 << 3, 1 << 1])  # a delivery marks nothing
    assert isinstance(store.spend_many([other], HEIGHT, ignore=BLOCK_SPEND, by_block=True)[0], list)
    assert marks(store, parent) == bytes([1 << 3 | 1 << 5, 1 << 1])
    assert store.unspend(spends[:2]) == [None, None]
    assert marks(store, parent) == bytes([1 << 5])
    # an unmarked slot is a delivery's to take back again
    frozen = funding(1)
    created(store, frozen, mined=True)
    assert store.freeze([((frozen.txid, 0), uhash(frozen, 0))]) == [None]
    (got,) = store.spend_many([child((parent, 9), (frozen, 0))], HEIGHT)
    assert isinstance(got, SpendRejected) and spender_of(store, parent, 9) is None
    assert store.get(parent.txid).spent_utxos == 1  # `other`'s, marked
