"""Conformance: external transactions of one record — raw bytes in the blob store, metadata and
slots in the record (Teranode's UTXO data model "External Blob Storage"), on every store backend."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest

from chain import Tx, parse_tx
from chain.build import build_tx, spend_input
from stores.blob.protocol import blob_key
from stores.utxo import BlockInfo, SpendStatus, StorageError, TxNotFound, UtxoStore, open_utxo_store
from tests.stores.helpers import child, created, funding, script, uhash


def test_a_tx_over_the_size_limit_is_external_and_reads_back_whole(store_url: str, tmp_path: Path) -> None:
    store = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs", max_tx_size_in_store=300)
    small, big = funding(1), funding(12)  # about 85 and 440 bytes
    metas = store.create_many([small, big], 100, [BlockInfo(1, 100)])
    assert [m.external for m in metas] == [False, True]  # type: ignore[union-attr]
    got = store.get(big.txid)
    assert got.external and got.total_extra_recs == 0 and got.size_in_bytes == big.size
    assert got.tx is not None and got.tx.txid == big.txid and got.tx.outputs == big.outputs
    assert store.get(small.txid).tx == store.get(small.txid, ["tx"]).tx  # in-record txs unchanged
    o = store.get_output((big.txid, 11))
    assert o is not None and (o.satoshis, o.script) == (big.outputs[11].satoshis, big.outputs[11].script)
    listed = {(u.txid, u.vout): u for u in store.iter_utxos(confirmed=True)}
    assert all(listed[(big.txid, v)].script == big.outputs[v].script for v in range(12))
    spender = child((big, 3), (big, 11))
    store.spend(spender, 101)
    assert store.get_spend((big.txid, 11), uhash(big, 11)).status is SpendStatus.SPENT
    store.close()


def test_externalize_all_stores_every_tx_extended_when_its_parents_are_known(
    store_url: str, tmp_path: Path
) -> None:
    store = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs", externalize_all=True)
    parent = funding(2)
    created(store, parent, height=100, mined=True)
    # Standard format: the store looks the previous outputs up (one in the store, one in the batch).
    a = build_tx([spend_input(parent, 0)], [(40_000, script())])
    b = build_tx([spend_input(parent, 1), spend_input(a, 0)], [(80_000, script())])
    a_std, b_std = parse_tx(a.raw), parse_tx(b.raw)
    assert not b_std.is_extended
    metas = store.create_many([a_std, b_std], 101)
    assert all(not isinstance(m, Exception) and m.external for m in metas)
    blob = store.external.blobs.get(blob_key(b.txid, "tx"))  # type: ignore[attr-defined]
    stored = parse_tx(blob)
    assert stored.is_extended and stored.txid == b.txid
    assert [(i.prev_satoshis, i.prev_script) for i in stored.inputs] == [
        (parent.outputs[1].satoshis, parent.outputs[1].script), (a.outputs[0].satoshis, a.outputs[0].script)
    ]
    store.spend_many([a_std, b_std], 101)
    assert store.set_mined_multi([a.txid, b.txid], 2, 101) == [[2], [2]]
    assert store.get(b.txid).fee == parent.outputs[1].satoshis + 40_000 - 80_000
    store.close()


def test_a_failing_blob_store_fails_that_tx_and_writes_no_record(
    store_url: str, s3_endpoint: str
) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:8]}"  # never created: every put fails
    url = f"s3://{bucket}/x?endpoint_url={s3_endpoint}&region=us-east-1"
    store = open_utxo_store(store_url, blob_url=url, max_tx_size_in_store=300)
    small, big = funding(1), funding(12)
    r_small, r_big = store.create_many([small, big], 100)
    assert not isinstance(r_small, Exception)
    assert isinstance(r_big, StorageError) and blob_key(big.txid, "tx") in str(r_big)
    with pytest.raises(TxNotFound):
        store.get(big.txid)
    # Once the blob store answers again, the same create goes through.
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    assert store.create(big, 100).external
    store.close()


def test_without_a_blob_store_an_external_tx_is_refused_clearly(store_url: str) -> None:
    store = open_utxo_store(store_url, max_tx_size_in_store=300)
    (r,) = store.create_many([funding(12)], 100)
    assert isinstance(r, StorageError) and "UTXO_BLOB_URL" in str(r)
    store.close()


def test_a_missing_blob_is_a_storage_error_naming_the_tx(store_url: str, tmp_path: Path) -> None:
    store = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs", externalize_all=True)
    tx = funding(2)
    created(store, tx, height=100)
    store.external.blobs.delete(blob_key(tx.txid, "tx"))  # type: ignore[attr-defined]
    with pytest.raises(StorageError, match=tx.txid_hex):
        store.get(tx.txid)
    assert store.get(tx.txid, ["fee", "external"]).external  # the record itself still reads
    store.close()


def test_external_txs_read_often_are_cached_within_a_bound(store_url: str, tmp_path: Path) -> None:
    store = open_utxo_store(
        store_url, blob_url=f"file://{tmp_path}/blobs", externalize_all=True, external_cache_bytes=1000
    )
    txs = [funding(2) for _ in range(8)]  # about 120 bytes each: the cache holds a few
    created(store, *txs, height=100)
    ext = store.external  # type: ignore[attr-defined]
    store.get(txs[0].txid)
    store.get(txs[0].txid)
    assert (ext.hits, ext.misses) == (1, 1)
    for t in txs:
        store.get(t.txid)
    assert ext._cached <= 1000 and len(ext._cache) < len(txs)
    store.close()


def test_the_real_megatx_goes_external_and_comes_back(
    store: UtxoStore, data_dir: Path, tmp_path: Path
) -> None:
    raw = (data_dir / "mainnet-megatx-bb41a757.tx").read_bytes()
    tx = parse_tx(raw)
    assert len(tx.inputs) == 5569 and tx.size == 999_657
    url = store.url
    store.close()
    ext = open_utxo_store(url, blob_url=f"file://{tmp_path}/blobs2", max_tx_size_in_store=500_000)
    meta = ext.create(tx, 420_000)
    assert meta.external and meta.fee is None  # its parents are not in the store
    got = ext.get(tx.txid)
    assert got.tx is not None and got.tx.raw == raw and got.size_in_bytes == 999_657
    assert len(got.inpoints) == 5569
    ext.close()


def test_an_unreadable_parent_blob_leaves_a_fee_unknown_not_a_block_unstored(
    store_url: str, tmp_path: Path
) -> None:
    maker = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs", max_tx_size_in_store=300)
    parent = funding(12)
    created(maker, parent, height=100, mined=True)  # by another process: not in `store`'s memory
    maker.close()
    store = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs", max_tx_size_in_store=300)
    store.external.blobs.delete(blob_key(parent.txid, "tx"))  # type: ignore[attr-defined]
    unrelated = funding(1)
    kid = parse_tx(child((parent, 0)).raw)  # standard format: its fee needs the parent's output
    r_unrelated, r_kid = store.create_many([unrelated, kid], 101)
    assert not isinstance(r_unrelated, Exception) and not isinstance(r_kid, Exception)
    assert r_kid.fee is None and store.get(kid.txid).fee is None
    store.close()


def test_a_record_pruned_while_a_listing_runs_is_skipped(store_url: str, tmp_path: Path) -> None:
    store = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs", max_tx_size_in_store=300)
    store.set_block_height(100)
    fillers = [funding(1) for _ in range(1100)]  # more than one chunk of the listing
    created(store, *fillers, height=100, mined=True)
    x = funding(12)  # external
    created(store, x, height=100, mined=True)
    spender = child(*[(x, v) for v in range(12)])
    created(store, spender, height=101)
    store.spend(spender, 101)  # unmined spender: x's outputs still count as confirmed unspent
    dah = store.get(x.txid, ["delete_at_height"]).delete_at_height
    assert dah is not None
    listing = store.iter_utxos(confirmed=True)
    first = next(listing)
    assert store.delete_expired([x.txid], dah) == 1
    rest = list(listing)
    assert first.txid != x.txid and all(u.txid != x.txid for u in rest)
    assert len(rest) + 1 == 1100
    store.close()


def spent_external(store: UtxoStore) -> tuple[Tx, int]:
    """An external tx, mined and all spent in the next block: due at its delete-at-height."""
    store.set_block_height(100)
    tx = funding(1)
    created(store, tx, height=100, mined=True)
    store.spend(child((tx, 0)), 101)
    dah = store.get(tx.txid, ["delete_at_height"]).delete_at_height
    assert dah is not None
    return tx, dah


def test_a_blob_that_cannot_be_removed_keeps_its_record_for_the_next_run(
    store_url: str, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    bucket = f"prune-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/x?endpoint_url={s3_endpoint}&region=us-east-1"
    store = open_utxo_store(store_url, blob_url=url, externalize_all=True)
    tx, dah = spent_external(store)
    keys = [obj["Key"] for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys  # the tx's blob
    saved = {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}
    for k in keys:
        s3.delete_object(Bucket=bucket, Key=k)
    s3.delete_bucket(Bucket=bucket)  # the blob store now fails every call
    with caplog.at_level("WARNING", logger="utxoflow.store"):
        r = store.prune([tx.txid], dah)
    assert (r.deleted, r.blob_kept, r.blobs_deleted) == (0, 1, 0)
    assert "stays until its blob can be removed" in caplog.text
    assert store.get(tx.txid, ["delete_at_height"]).delete_at_height == dah  # still there, still due
    s3.create_bucket(Bucket=bucket)  # the store is back, with the blob
    for k, data in saved.items():
        s3.put_object(Bucket=bucket, Key=k, Body=data)
    r = store.prune([tx.txid], dah)
    assert (r.deleted, r.blob_kept, r.blobs_deleted) == (1, 0, 1)
    with pytest.raises(TxNotFound):
        store.get(tx.txid)
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # the blob went first
    store.close()


def test_a_record_whose_blob_is_already_gone_is_pruned(store_url: str, tmp_path: Path) -> None:
    """A crash between a blob's removal and its record's leaves a due record naming a missing
    blob: the next run deletes it."""
    store = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs", externalize_all=True)
    tx, dah = spent_external(store)
    store.external.blobs.delete(blob_key(tx.txid, "tx"))  # type: ignore[attr-defined]
    r = store.prune([tx.txid], dah)
    assert (r.deleted, r.blob_kept, r.blobs_deleted) == (1, 0, 1)
    with pytest.raises(TxNotFound):
        store.get(tx.txid)
    store.close()
