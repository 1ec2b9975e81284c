"""A block's spend call puts a token of its own on each slot it spends (`blockSpent`), and a
take-back reverts a slot only while it holds no token or the taking call's own. There is no
transaction across the records of one spend, so a refused call's take-back can land after
another call spent for the same transaction: a refused delivery after a block's spend, or a
block's spend unit run twice (a holder that lapsed but lived on) after the run that went
through. Without the tokens both freed an input of the mined transaction (found by review).
An unspend reverts a slot whatever it holds and clears its token. Needs AEROSPIKE_HOSTS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chain import Tx
from stores.utxo import SpendRejected
from tests.aerospike_server import fresh_store, needs_aerospike
from tests.stores.helpers import child, created, funding, uhash
from workers.chainstate.conflicts import BLOCK_SPEND

pytestmark = needs_aerospike
HEIGHT = 101


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    yield from fresh_store(32, f"file://{tmp_path}/blobs", height=100)


def tokens(store: Any, tx: Tx) -> dict[int, int]:
    """The block call tokens on `tx`'s master record's slots: slot → token (absent: none)."""
    _k, _m, bins = store.conn.client.get(store.key(tx.txid))
    raw = bytes(bins.get("blockSpent") or b"")
    assert len(raw) % 4 == 0 and not raw.endswith(b"\0" * 4)  # (trailing empty ones dropped)
    got = {k: int.from_bytes(raw[4 * k : 4 * k + 4], "little") for k in range(len(raw) // 4)}
    return {k: t for k, t in got.items() if t}


def spender_of(store: Any, tx: Tx, vout: int) -> bytes | None:
    (out,) = store.get_outputs([(tx.txid, vout)]).values()
    spender: bytes | None = out.spending_txid
    return spender


def before_take_back(store: Any, monkeypatch: pytest.MonkeyPatch, via: str, then: Any) -> None:
    """Run `then()` just before the store's next take-back sent through `store.conn.<via>`
    (`apply_many`: a batch's; `apply`: a transaction that went alone)."""
    real = getattr(store.conn, via)

    def hooked(*args: Any) -> Any:
        fn = args[0][0][1] if via == "apply_many" and args[0] else args[1] if via == "apply" else None
        if fn == "take_back":
            monkeypatch.setattr(store.conn, via, real)
            then()
        return real(*args)

    monkeypatch.setattr(store.conn, via, hooked)


def block_spends(store: Any, tx: Tx, by_block: bool = True) -> None:
    """A block's spend of `tx`, which must go through (`by_block` off: as before the tokens)."""
    (r,) = store.spend_many([tx], HEIGHT, ignore=BLOCK_SPEND, by_block=by_block)
    assert not isinstance(r, Exception), r


@pytest.mark.parametrize("by_block", [True, False], ids=["marked", "unmarked (the race)"])
def test_a_refused_delivery_cannot_free_an_input_a_block_spent_meanwhile(
    store: Any, monkeypatch: pytest.MonkeyPatch, by_block: bool
) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    store.set_locked([p2.txid], True)  # a delivery is refused there; a block's spend is not
    tx = child((p1, 0), (p2, 0))

    before_take_back(store, monkeypatch, "apply_many", lambda: block_spends(store, tx, by_block))
    (got,) = store.spend_many([tx], HEIGHT)  # the delivery: spends p1, refused by p2
    assert isinstance(got, SpendRejected)
    assert spender_of(store, p2, 0) == tx.txid
    if by_block:  # the block's spend stands whole
        assert spender_of(store, p1, 0) == tx.txid
        assert store.get(p1.txid).spent_utxos == 1
    else:  # what the block's spend risked before the tokens: its input freed under it
        assert spender_of(store, p1, 0) is None


def test_a_block_unit_run_twice_cannot_free_an_input_the_run_that_went_through_spent(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spend unit's holder lapsed but lived on: its run of the block's spend for `tx` is
    refused (a mempool rival holds an input), and its take-back lands after the run that took
    the unit over made the rival conflicting and spent for `tx` whole."""
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    rival = child((p2, 0))
    (held,) = store.spend_many([rival], HEIGHT)
    assert isinstance(held, list)
    tx = child((p1, 0), (p2, 0))

    def the_other_run() -> None:  # what the block's conflict swap does, then its spend
        assert store.unspend(held) == [None]
        block_spends(store, tx)

    # the lapsed run's last take-back: `spend_tx`'s, once its batch's went and it ran alone
    before_take_back(store, monkeypatch, "apply", the_other_run)
    (got,) = store.spend_many([tx], HEIGHT, ignore=BLOCK_SPEND, by_block=True)
    assert isinstance(got, SpendRejected)
    assert spender_of(store, p1, 0) == tx.txid and spender_of(store, p2, 0) == tx.txid
    assert store.get(p1.txid).spent_utxos == 1


def test_a_block_calls_own_take_back_reverts_and_unmarks(store: Any) -> None:
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    assert store.freeze([((p2.txid, 0), uhash(p2, 0))]) == [None]
    tx = child((p1, 0), (p2, 0))
    (got,) = store.spend_many([tx], HEIGHT, ignore=BLOCK_SPEND, by_block=True)
    assert isinstance(got, SpendRejected)  # frozen refuses a block too
    assert spender_of(store, p1, 0) is None and tokens(store, p1) == {}
    # and a delivery refused the same way takes its own spend back (no mark left to stop it)
    (got,) = store.spend_many([child((p1, 0), (p2, 0))], HEIGHT)
    assert isinstance(got, SpendRejected) and spender_of(store, p1, 0) is None


def test_tokens_follow_the_slots_and_an_unspend_clears_them(store: Any) -> None:
    parent = funding(20)
    created(store, parent, mined=True)
    tx = child((parent, 3), (parent, 9), (parent, 17))
    (spends,) = store.spend_many([tx], HEIGHT, ignore=BLOCK_SPEND, by_block=True)
    assert isinstance(spends, list)
    first = tokens(store, parent)
    assert set(first) == {3, 9, 17} and len(set(first.values())) == 1  # one call, one token
    assert store.unspend([s for s in spends if s.vout == 17]) == [None]
    assert tokens(store, parent) == {3: first[3], 9: first[9]}
    # a spend a delivery made, then found by a block's call: that call's token (none before)
    other = child((parent, 5))
    assert isinstance(store.spend_many([other], HEIGHT)[0], list)
    assert set(tokens(store, parent)) == {3, 9}
    block_spends(store, other)
    now = tokens(store, parent)
    assert set(now) == {3, 5, 9} and now[5] != first[3]
    late = child((parent, 3), (parent, 9))
    (refused,) = store.spend_many([late], HEIGHT, ignore=BLOCK_SPEND, by_block=True)
    assert isinstance(refused, SpendRejected)  # spent by `tx`: a refused call leaves their tokens
    assert tokens(store, parent) == now
    assert store.unspend(spends[:2]) == [None, None]
    assert tokens(store, parent) == {5: now[5]}
    # an unmarked slot is a delivery's to take back again
    frozen = funding(1)
    created(store, frozen, mined=True)
    assert store.freeze([((frozen.txid, 0), uhash(frozen, 0))]) == [None]
    (got,) = store.spend_many([child((parent, 9), (frozen, 0))], HEIGHT)
    assert isinstance(got, SpendRejected) and spender_of(store, parent, 9) is None
    assert store.get(parent.txid).spent_utxos == 1  # `other`'s, marked


def test_take_back_dead_keeps_what_a_block_spent_for_the_tx_meanwhile(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused delivery of `tx` finds no record and frees what a dead attempt left; a block
    makes the record and spends for `tx` between that look and the frees (`take_back_dead`
    looks first, then calls per input). The block's token keeps its spend: nothing is freed."""
    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    tx = child((p1, 0), (p2, 0))
    (dead,) = store.spend_many([tx], HEIGHT)  # the attempt that died (held p1 and p2)
    assert isinstance(dead, list)
    real = store.rules.take_back_input

    def the_block_first(*args: Any) -> Any:
        monkeypatch.setattr(store.rules, "take_back_input", real)
        created(store, tx, height=HEIGHT, mined=True)
        block_spends(store, tx)  # finds both slots its tx's: marks them
        return real(*args)

    monkeypatch.setattr(store.rules, "take_back_input", the_block_first)
    assert store.take_back_dead(tx) == 0
    assert spender_of(store, p1, 0) == tx.txid and spender_of(store, p2, 0) == tx.txid


def test_a_record_made_beside_a_refused_delivery_holds_its_inputs_again(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same window with a delivery beside the refused one: it made the record (its inputs
    all its own when it looked) before the refused delivery freed one. `apply_tx` looks for
    the record after freeing, finds it, and spends the freed input again for it."""
    from workers.chainstate.mempool import apply_tx

    p1, p2 = funding(1), funding(1)
    created(store, p1, p2, mined=True)
    tx = child((p1, 0), (p2, 0))
    (dead,) = store.spend_many([tx], HEIGHT)
    assert isinstance(dead, list)
    assert store.unspend([s for s in dead if s.txid == p2.txid]) == [None]  # died after p1 only
    rival = child((p2, 0))
    (held,) = store.spend_many([rival], HEIGHT)  # a rival's brief hold of p2
    assert isinstance(held, list)
    real = store.rules.take_back_input

    def the_other_delivery(*args: Any) -> Any:
        monkeypatch.setattr(store.rules, "take_back_input", real)
        assert store.unspend(held) == [None]  # the rival's hold ends (it was refused)
        assert apply_tx(store, tx) is True  # the delivery beside: spends p2, makes the record
        return real(*args)

    monkeypatch.setattr(store.rules, "take_back_input", the_other_delivery)
    refused = apply_tx(store, tx)  # p2 is the rival's: refused, and frees p1 (no record yet)
    assert isinstance(refused, SpendRejected)
    assert spender_of(store, p1, 0) == tx.txid and spender_of(store, p2, 0) == tx.txid
    assert not store.get(tx.txid).conflicting
