"""Backends under test: every test that takes `store` (or `store_url`) runs on each of them.

PostgreSQL gets a fresh database per test session (created here, dropped at the end); each test
then starts from empty tables. SQLite gets a new file per test. Aerospike (with AEROSPIKE_HOSTS
set; skipped otherwise) gets an emptied set of a pool per test (tests/aerospike_server.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stores.utxo import UtxoStore, open_utxo_store
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.conftest import BLOB_BACKENDS, new_blob_url

BACKENDS = ["sqlite", "postgresql", pytest.param("aerospike", marks=needs_aerospike)]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/utxo.db"
        return
    if request.param == "aerospike":
        url = new_url()
        yield url
        drop_set(None, url)
        return
    url: str = request.getfixturevalue("pg_url")
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("txs", "tx_pages", "tx_creations", "meta", "tx_locks", "script_utxos"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    yield url


@pytest.fixture
def store(store_url: str, tmp_path: Path) -> Iterator[UtxoStore]:
    s = open_utxo_store(store_url, retention=288, blob_url=f"file://{tmp_path}/blobs")
    yield s
    s.close()


PAGE = 4  # outputs per record in the multi-record tests: a 10-output tx spans 3 records


@pytest.fixture(params=BLOB_BACKENDS)
def paged(request: pytest.FixtureRequest, store_url: str, tmp_path: Path) -> Iterator[UtxoStore]:
    """A store whose records hold PAGE outputs, with its external transactions in a file or
    S3 blob store (every backend × every blob backend)."""
    s = open_utxo_store(store_url, retention=288, batch_size=PAGE, blob_url=new_blob_url(request, tmp_path))
    yield s
    s.close()
