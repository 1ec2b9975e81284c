"""The bytes of mempool transactions in flight (stores/state/txbytes.py), on every backend: kept
in the registration's write, never replaced, there while the message or the recovery entry is
pending, gone with the release that ends the entry (unless the message is pending again), and
swept once neither needs them."""

from __future__ import annotations

import time

from stores.state import PendingDone, StateStore


def ident(n: int) -> str:
    return f"tx:{n:064x}"


def register(state: StateStore, *ns: int, raw: bytes | None = None) -> None:
    entries = [(ident(n), "tx", ident(n)[3:]) for n in ns]
    state.add_pending_many(entries, "run", {ident(n): raw or bytes([n]) * 3 for n in ns})


def end(state: StateStore, n: int, status: str) -> bool:
    """A claim of the recovery entries, `n`'s released as `status`, the others left pending."""
    time.sleep(0.002)  # (claims take entries stored before now)
    ended = False
    for e in state.recovery_claim("h", 30, 0, 100):
        if e.ident == ident(n):
            ended = state.recovery_release(e.ident, "h", f"{status}: test", status)
        else:
            state.recovery_release(e.ident, "h", "checked")
    return ended


def test_bytes_come_with_the_registration_and_are_never_replaced(state: StateStore) -> None:
    register(state, 1, 2)
    state.add_pending_many([(ident(3), "tx", ident(3)[3:])], "run")  # (a large one: in the blob store)
    assert state.tx_bytes([ident(1), ident(2), ident(3)]) == {ident(1): b"\1\1\1", ident(2): b"\2\2\2"}
    register(state, 1, raw=b"other")  # sent again: the bytes a txid names stay
    assert state.tx_bytes([ident(1)]) == {ident(1): b"\1\1\1"}
    assert state.tx_bytes([]) == {}
    many = [ident(n) for n in range(10, 1300)]  # past one IN list
    state.add_pending_many([(i, "tx", i[3:]) for i in many], "run", dict.fromkeys(many, b"x"))
    assert len(state.tx_bytes(many)) == len(many)


def test_bytes_stay_while_the_message_or_the_entry_is_pending(state: StateStore) -> None:
    register(state, 1, 2, 3)
    state.remove_pending_many([PendingDone(ident(n), accepted=True) for n in (1, 2, 3)])
    assert state.sweep_tx_bytes() == 0  # the recovery entries still pending: all kept
    assert len(state.tx_bytes([ident(1), ident(2), ident(3)])) == 3
    assert end(state, 1, "confirmed")  # the release that ends the entry takes them
    assert state.tx_bytes([ident(1)]) == {}
    register(state, 2)  # sent again before its entry ends: the message needs them
    assert end(state, 2, "deleted")
    assert state.tx_bytes([ident(2)]) == {ident(2): b"\2\2\2"}
    assert state.sweep_tx_bytes() == 0
    state.remove_pending(ident(2))  # its message done after the entry ended: the sweep takes them
    assert state.sweep_tx_bytes() == 1 and state.tx_bytes([ident(2)]) == {}
    assert state.tx_bytes([ident(3)]) == {ident(3): b"\3\3\3"} and state.sweep_tx_bytes() == 0


def test_bytes_of_a_tx_whose_entry_had_ended_go_once_its_message_is_done(state: StateStore) -> None:
    register(state, 4)
    state.remove_pending(ident(4))
    assert end(state, 4, "orphan")
    register(state, 4)  # enqueued again: a new message, the entry stays ended
    assert state.tx_bytes([ident(4)]) == {ident(4): b"\4\4\4"} and state.sweep_tx_bytes() == 0
    state.remove_pending(ident(4), accepted=True)
    assert state.sweep_tx_bytes() == 1
