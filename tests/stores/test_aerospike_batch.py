"""How the store's batches go to the server: a batch of distinct records is spread over the
service threads, one that comes back to a record many times runs inline, so that its calls
do not queue on the record past the server's limit and come back busy. Needs AEROSPIKE_HOSTS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.aerospike_server import drop_set, needs_aerospike, new_url

pytestmark = needs_aerospike


class Recording:
    """The real client, with the policy and the results of each batch_write (and, in
    `methods`, which of batch_write and batch_apply sent it) kept."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sent: list[tuple[dict[str, Any], list[int]]] = []
        self.methods: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def batch_write(self, records: Any, policy: dict[str, Any]) -> Any:
        done = self.client.batch_write(records, policy)
        self.sent.append((dict(policy), [r.result for r in done.batch_records]))
        self.methods.append("batch_write")
        return done

    def batch_apply(self, keys: Any, module: str, fn: str, args: Any, policy: dict[str, Any]) -> Any:
        done = self.client.batch_apply(keys, module, fn, args, policy)
        self.sent.append((dict(policy), [r.result for r in done.batch_records]))
        self.methods.append("batch_apply")
        return done


@pytest.fixture
def conn() -> Iterator[Any]:
    from stores.utxo.aerospike.client import Connection

    url = new_url()
    c = Connection(url)
    real = c.client
    c.client = Recording(real)
    yield c
    c.client = real
    drop_set(c.client, url)
    c.close()


def adds(conn: Any, keys: list[Any]) -> list[Any]:
    from aerospike_helpers.batch import records as br
    from aerospike_helpers.operations import operations as op

    return conn.batch("adding", lambda i: br.Write(keys[i], [op.increment("n", 1)]), len(keys))


def counts(conn: Any, keys: list[Any]) -> list[int]:
    return [(rec or {}).get("n", 0) for rec in conn.read_bins(keys)]


def test_distinct_records_are_spread_over_the_service_threads(conn: Any) -> None:
    keys = [conn.key(bytes([k]) * 32) for k in range(1, 41)]
    done = adds(conn, keys)
    assert [r.result for r in done] == [0] * 40
    assert [(p["allow_inline"], p["allow_inline_ssd"]) for p, _r in conn.client.sent] == [(False, False)]
    assert counts(conn, keys) == [1] * 40


def test_a_record_called_many_times_in_one_batch_runs_inline_and_never_busy(conn: Any) -> None:
    from stores.utxo.aerospike.client import SPREAD_REPEATS

    hot = conn.key(b"\x07" * 32)
    others = [conn.key(bytes([k]) * 32) for k in range(8, 28)]
    keys = [hot] * 400 + others
    done = adds(conn, keys)
    assert [r.result for r in done] == [0] * len(keys)
    assert [(p["allow_inline"], p["allow_inline_ssd"]) for p, _r in conn.client.sent] == [(True, True)]
    assert counts(conn, [hot, *others]) == [400] + [1] * 20
    # a few calls on one record are no reason to give up the threads
    conn.client.sent.clear()
    few = conn.key(b"\x30" * 32)
    adds(conn, [few] * SPREAD_REPEATS + others)
    assert [p["allow_inline"] for p, _r in conn.client.sent] == [False]
    assert counts(conn, [few]) == [SPREAD_REPEATS]


def test_one_call_on_many_records_goes_as_one_batch_apply_spread_or_inline(conn: Any) -> None:
    """`apply_all` (a block's set-mined: one call, every record) sends the call once per batch
    with the same policies as `batch`: spread when the records are distinct, inline when one
    repeats; each record's own answer comes back in order."""
    from aerospike_helpers.batch import records as br
    from aerospike_helpers.operations import operations as op

    keys = [conn.key(bytes([k]) * 32) for k in range(1, 31)]
    conn.batch("making", lambda i: br.Write(keys[i], [op.write("creating", i % 2)]), len(keys))
    missing = conn.key(b"\x60" * 32)
    conn.client.sent.clear()
    conn.client.methods.clear()
    got = conn.apply_all([*keys, missing], "clear_creating", [])
    assert got == [i % 2 for i in range(30)] + [{"code": "TX_NOT_FOUND"}]
    assert conn.client.methods == ["batch_apply"]  # the call once, not an Apply per record
    assert [
        (p["allow_inline"], p["allow_inline_ssd"], p["max_retries"], set(r)) for p, r in conn.client.sent
    ] == [(False, False, 0, {0})]
    assert [b["creating"] for b in conn.read_bins(keys)] == [0] * 30
    conn.client.sent.clear()
    hot = [keys[1]] * 50 + keys[2:6]
    assert conn.apply_all(hot, "clear_creating", []) == [0] * 54
    assert [(p["allow_inline"], set(r)) for p, r in conn.client.sent] == [(True, {0})]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    from tests.aerospike_server import fresh_store

    yield from fresh_store(1024, f"file://{tmp_path}/blobs")


def test_a_thousand_spends_of_one_parent_in_one_call_go_through_in_one_round(store: Any) -> None:
    """Lua spends on one record take long enough that, spread, most of a thousand queued on it
    came back busy (770, measured) and were sent again; inline, none is."""
    from chain import TxIn
    from chain.build import build_tx, p2pkh, spend_input
    from stores.utxo import BlockInfo

    parent = build_tx(
        [TxIn(b"\x01" * 32, 0, b"\x51", 0xFFFFFFFF, 10**9, p2pkh(b"\x00" * 20))],
        [(1000, p2pkh(v.to_bytes(20, "big"))) for v in range(1000)],
    )
    assert not isinstance(store.create_many([parent], 1, [BlockInfo(0, 1)])[0], Exception)
    kids = [build_tx([spend_input(parent, v)], [(500, p2pkh(b"\x02" * 20))]) for v in range(1000)]
    real = store.conn.client
    store.conn.client = rec = Recording(real)
    try:
        got = store.spend_many(kids, 2)
    finally:
        store.conn.client = real
    assert [len(r) for r in got] == [1] * 1000  # one spend each, none refused
    assert [(p["allow_inline"], set(r)) for p, r in rec.sent] == [(True, {0})]
    assert store.get(parent.txid).spent_utxos == 1000
