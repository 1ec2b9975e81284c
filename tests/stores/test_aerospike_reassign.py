"""A reassign of an output on a child page changes the page, then notes it on the master (the
log, the spendable height, one more UTXO) in a second call: a process that dies between the two
leaves the master without the note. The next reassign of that output (refused, as the kernel
refuses a second one) makes the note, once. Needs AEROSPIKE_HOSTS."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stores.utxo import UtxoMismatch
from stores.utxo.kernel.outputs import REASSIGN_DELAY
from tests.aerospike_server import fresh_store, needs_aerospike
from tests.stores.helpers import created, funding, uhash

pytestmark = needs_aerospike


@pytest.fixture
def store() -> Iterator[Any]:
    yield from fresh_store(4, "file:///tmp/utxoflow-reassign-blobs")


def test_a_reassign_that_died_before_noting_its_master_is_noted_by_the_next(store: Any) -> None:
    store.set_block_height(100)
    f = funding(10)  # outputs 4…7 on page 1
    created(store, f)
    op, new = (f.txid, 5), b"\x42" * 32
    assert store.freeze([(op, uhash(f, 5))]) == [None]
    total = store.get(f.txid).total_utxos
    # the page's half of the reassign alone: the process died before the master's note
    key, slot = store.rules.where(op)
    assert store.conn.apply(key, "alert", ["reassign", slot, 5, uhash(f, 5), new, 100, REASSIGN_DELAY]) == 0
    assert store.get(f.txid).reassignments == [] and store.get(f.txid).total_utxos == total
    for _again in range(2):  # refused as a second reassign is, and the note is made once
        with pytest.raises(UtxoMismatch):
            store.reassign(op, uhash(f, 5), new)
        meta = store.get(f.txid)
        assert [e["offset"] for e in meta.reassignments] == [5] and meta.total_utxos == total + 1
