"""Conformance: a block's worth of new records (PostgreSQL copies them: `COPY`, from
`postgresql.COPY_FROM` rows on) is stored exactly as the same records created a few at a time
(INSERT statements), on every backend; a txid stored already among them is TxExists for it
alone, whichever way the rows went in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stores.utxo import BlockInfo, TxExists, UtxoStore, open_utxo_store
from stores.utxo.postgresql import COPY_FROM
from tests.stores.helpers import child, funding


def rows(store: UtxoStore, txids: list[bytes]) -> list[tuple[Any, ...]]:
    """Every column of these records but the row id and the creation time, by txid."""
    s: Any = store
    if s.url.startswith("aerospike://"):  # the records' bins, read by key with the client itself
        found = s._read_bins([s.key(t) for t in txids])
        skip = ("createdAt", "rid")  # (a record made again gets a new id, as a SQL row would)
        return sorted(tuple(sorted((k, v) for k, v in b.items() if k not in skip)) for b in found if b)
    cols = (
        "txid, version, locktime, fee, size_in_bytes, is_coinbase, spending_height, locked, "
        "creating, conflicting, unmined_since, preserve_until, delete_at_height, external, "
        "total_extra_recs, total_utxos, spent_utxos, blocks, conflicting_children, "
        "deleted_children, reassignments, spendable_in, inpoints, utxos, raw_format, raw"
    )
    got = s.db.read("rows", lambda cur: s.db.select_in(cur, f"SELECT {cols} FROM txs WHERE txid", txids))
    return sorted(tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in got)


def test_many_at_once_store_what_a_few_at_a_time_do(store: UtxoStore) -> None:
    """The same transactions created all at once, deleted, then created four at a time: every
    column alike (but the row id and creation time), under every creation option."""
    n = COPY_FROM + 8
    for blocks, flags in (
        ((), {}),
        ([BlockInfo(7, 100)], {}),
        ((), {"locked": True}),
        ((), {"conflicting": True}),
        ((), {"frozen": True}),
    ):
        txs = [funding() for _ in range(n)]
        txids = [t.txid for t in txs]
        assert all(r is None for r in store.create_many(txs, 100, blocks, meta=False, **flags))
        at_once = rows(store, txids)
        assert store.delete_txs(txids) == n
        for k in range(0, n, 4):  # below the copy threshold: INSERT statements
            assert all(r is None for r in store.create_many(txs[k : k + 4], 100, blocks, meta=False, **flags))
        assert rows(store, txids) == at_once and len(at_once) == n, (blocks, flags)


def test_a_stored_txid_among_many_is_refused_alone(store: UtxoStore) -> None:
    n = COPY_FROM + 8
    txs = [funding() for _ in range(n)]
    assert store.create_many([txs[5], txs[30]], 100, meta=False) == [None, None]
    results = store.create_many(txs, 100, meta=False)
    assert [k for k, r in enumerate(results) if isinstance(r, TxExists)] == [5, 30]
    assert all(r is None for k, r in enumerate(results) if k not in (5, 30))
    assert store.existing([t.txid for t in txs]) == {t.txid for t in txs}


def test_external_records_many_at_once_store_what_a_few_at_a_time_do(store_url: str, tmp_path: Path) -> None:
    """The same for records whose transactions live in the blob store (every column a value:
    `codec.COPY_TX`)."""
    ext = open_utxo_store(store_url, retention=288, blob_url=f"file://{tmp_path}/blobs", externalize_all=True)
    try:
        n = COPY_FROM + 8
        txs = [funding() for _ in range(n)]
        txids = [t.txid for t in txs]
        assert all(r is None for r in ext.create_many(txs, 100, meta=False))
        at_once = rows(ext, txids)
        if store_url.startswith("aerospike://"):
            assert all(dict(r).get("external") == 1 for r in at_once)  # external
        else:
            assert all(r[13] == 1 for r in at_once)  # external
        assert ext.delete_txs(txids) == n
        for k in range(0, n, 4):
            assert all(r is None for r in ext.create_many(txs[k : k + 4], 100, meta=False))
        assert rows(ext, txids) == at_once and len(at_once) == n
        assert ext.get(txs[7].txid).tx == txs[7]  # read back from its blob
    finally:
        ext.close()


def test_conflicting_records_many_at_once_are_listed_on_their_parents(store: UtxoStore) -> None:
    """Created conflicting, many at once: each is listed on its stored parent, once."""
    n = COPY_FROM + 8
    parents = [funding() for _ in range(n)]
    assert all(r is None for r in store.create_many(parents, 100, meta=False))
    children = [child((p, 0)) for p in parents]
    assert all(r is None for r in store.create_many(children, 100, meta=False, conflicting=True))
    for p, c in zip(parents, children):
        assert list(store.get(p.txid, ["conflicting_children"]).conflicting_children) == [c.txid]
