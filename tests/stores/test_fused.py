"""Conformance: `fused` — every write inside one transaction where the backend has one writer
(SQLite), committed at the end or not at all; each call inside all-or-nothing as ever; a
no-op elsewhere (every backend: the observable results are the same, only atomicity differs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stores.errors import StorageError
from stores.sqldb import Database
from stores.utxo import TxExists, UtxoStore, open_utxo_store
from tests.stores.helpers import child, created, funding


def test_writes_inside_are_seen_inside_and_kept_after(store: UtxoStore) -> None:
    a, b = funding(), funding()
    c = child((a, 0))
    with store.fused():
        created(store, a)
        assert store.existing([a.txid]) == {a.txid}  # a read inside sees the write before it
        store.spend_many([c], 101)
        created(store, b)
    assert store.existing([a.txid, b.txid]) == {a.txid, b.txid}
    assert store.get_outputs([(a.txid, 0)])[(a.txid, 0)].spending_txid == c.txid


def test_a_refused_call_inside_changes_nothing_of_its_own(store: UtxoStore) -> None:
    a = funding()
    with store.fused():
        created(store, a)
        (again,) = store.create_many([a], 100)  # refused: the rest of the transaction stands
        assert isinstance(again, TxExists)
        created(store, funding())
    assert store.existing([a.txid]) == {a.txid}


def test_an_error_out_of_it_keeps_nothing_on_sqlite(store: UtxoStore, store_url: str) -> None:
    a, b = funding(), funding()
    created(store, a)
    with pytest.raises(RuntimeError), store.fused():
        created(store, b)
        store.spend_many([child((a, 0))], 101)
        raise RuntimeError("the worker dies here")
    if store_url.startswith("sqlite"):  # one transaction: none of it happened
        assert store.existing([a.txid, b.txid]) == {a.txid}
        assert store.get_outputs([(a.txid, 0)])[(a.txid, 0)].spending_txid is None
    else:  # a no-op: each call committed on its own
        assert store.existing([a.txid, b.txid]) == {a.txid, b.txid}


def test_nothing_inside_is_seen_by_another_sqlite_connection_before_the_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/utxo.db"
    store = open_utxo_store(url, retention=288, blob_url=f"file://{tmp_path}/blobs")
    other = open_utxo_store(url, retention=288, blob_url=f"file://{tmp_path}/blobs")
    try:
        a = funding()
        with store.fused():
            created(store, a)
            assert other.existing([a.txid]) == set()
        assert other.existing([a.txid]) == {a.txid}
    finally:
        other.close()
        store.close()


def test_a_blob_goes_only_when_its_record_s_deletion_commits(store_url: str, tmp_path: Path) -> None:
    s = open_utxo_store(store_url, retention=288, blob_url=f"file://{tmp_path}/blobs", externalize_all=True)
    try:
        a, b = funding(), funding()
        created(s, a, b)
        with pytest.raises(RuntimeError), s.fused():
            s.delete_txs([a.txid])  # a refused block's take-back, inside its transaction...
            raise RuntimeError("...which then rolls back")
        if store_url.startswith("sqlite"):  # the record is back: so is its blob
            assert s.get(a.txid).tx == a
        with s.fused():
            s.delete_txs([b.txid])
        assert s.existing([a.txid, b.txid]) == ({a.txid} if store_url.startswith("sqlite") else set())
        assert not s.external.exists(b.txid)  # type: ignore[attr-defined]
    finally:
        s.close()


def test_an_error_that_rolls_the_whole_transaction_back_fails_every_unit_after_it(tmp_path: Path) -> None:
    """Disk full inside: SQLite rolls the transaction back whole and forgets its savepoints. A
    caller that carries on finds every later unit failing, and the end too: never half of it."""
    db = Database(f"sqlite:///{tmp_path}/x.db")
    try:
        db.write("table", lambda c: c.execute("CREATE TABLE t (a BLOB)"))
        pages = db.outside("PRAGMA page_count")[0][0]
        db.outside(f"PRAGMA max_page_count={pages + 3}")
        with pytest.raises(StorageError, match="rolled back by an error"), db.held():
            db.write("a", lambda c: c.execute("INSERT INTO t VALUES (1)"))
            with pytest.raises(StorageError, match="full"):
                db.write("big", lambda c: c.execute("INSERT INTO t VALUES (?)", (b"x" * 200_000,)))
            with pytest.raises(StorageError, match="earlier one"):
                db.write("b", lambda c: c.execute("INSERT INTO t VALUES (2)"))
        assert db.read("rows", lambda c: c.execute("SELECT a FROM t").fetchall()) == []
        with db.held():  # and the next transaction is whole again
            db.write("c", lambda c: c.execute("INSERT INTO t VALUES (3)"))
        assert db.read("rows", lambda c: c.execute("SELECT a FROM t").fetchall()) == [(3,)]
    finally:
        db.close()


def test_a_transaction_that_cannot_begin_is_a_storage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    db, other = Database(url, busy_timeout_s=0.2), Database(url)
    try:
        other.outside("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(StorageError, match="database is locked"), db.held():
            pass
        other.outside("ROLLBACK")
        with db.held():
            pass
    finally:
        db.close()
        other.close()


def test_a_fused_inside_another_is_all_or_nothing_by_itself(store: UtxoStore, store_url: str) -> None:
    a, b, c = funding(), funding(), funding()
    with store.fused():
        created(store, a)
        with pytest.raises(RuntimeError), store.fused():
            created(store, b)
            store.spend_many([child((a, 0))], 101)
            raise RuntimeError("this block is refused")
        created(store, c)
        with store.fused():  # one that ends well stays, as part of the outer
            store.spend_many([child((c, 0))], 101)
    if store_url.startswith("sqlite"):  # the inner one's writes went; the rest stands
        assert store.existing([a.txid, b.txid, c.txid]) == {a.txid, c.txid}
        assert store.get_outputs([(a.txid, 0)])[(a.txid, 0)].spending_txid is None
    else:  # a no-op: each call committed on its own
        assert store.existing([a.txid, b.txid, c.txid]) == {a.txid, b.txid, c.txid}
    assert store.get_outputs([(c.txid, 0)])[(c.txid, 0)].spending_txid is not None


def test_work_after_the_commit_goes_with_the_savepoint_that_left_it(tmp_path: Path) -> None:
    """`after_commit` work (deleting the blob of a deleted record) left by a nested `held` that
    is rolled back does not run at the end: the deletion it was for did not happen."""
    db = Database(f"sqlite:///{tmp_path}/x.db")
    ran: list[str] = []
    try:
        db.write("table", lambda c: c.execute("CREATE TABLE t (a INTEGER)"))
        with db.held():
            db.write("a", lambda c: c.execute("INSERT INTO t VALUES (1)"))
            db.after_commit(lambda: ran.append("kept"))
            with pytest.raises(RuntimeError), db.held():
                db.write("b", lambda c: c.execute("DELETE FROM t"))
                db.after_commit(lambda: ran.append("rolled back"))
                raise RuntimeError("this block is refused")
            with db.held():
                db.after_commit(lambda: ran.append("nested, kept"))
            assert ran == []  # nothing before the commit
        assert ran == ["kept", "nested, kept"]
        assert db.read("rows", lambda c: c.execute("SELECT a FROM t").fetchall()) == [(1,)]
    finally:
        db.close()


def test_the_height_moves_inside_and_goes_back_with_what_is_rolled_back(
    store: UtxoStore, store_url: str
) -> None:
    """The next block of a batch counts from the height the one before it set (its delete-at-
    heights depend on it); a block rolled back takes its height back with it."""
    s: Any = store
    store.set_block_height(100)
    with pytest.raises(RuntimeError), store.fused():
        store.set_block_height(105)
        assert s.height_for() == 105
        with pytest.raises(RuntimeError), store.fused():
            store.set_block_height(106)
            assert s.height_for() == 106
            raise RuntimeError("this block is refused")
        assert s.height_for() == (105 if store_url.startswith("sqlite") else 106)
        raise RuntimeError("the worker dies here")
    assert s.height_for() == (100 if store_url.startswith("sqlite") else 106)
    assert store.current_height() == s.height_for()  # as stored
