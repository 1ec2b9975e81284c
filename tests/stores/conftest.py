"""Backends under test: every test that takes `store` (or `store_url`) runs on each of them.

PostgreSQL gets a fresh database per test session (created here, dropped at the end); each test
then starts from empty tables. SQLite gets a new file per test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stores.utxo import UtxoStore, open_utxo_store
from tests.conftest import BLOB_BACKENDS, new_blob_url

PG_ADMIN = os.environ.get("UTXOFLOW_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    name = f"utxoflow_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.Error as e:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN}: {e} (.ci/run starts it)")
    admin.execute(f'CREATE DATABASE "{name}"')
    base, _db = PG_ADMIN.rsplit("/", 1)
    yield f"{base}/{name}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/utxo.db"
    url: str = request.getfixturevalue("pg_url")
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("txs", "tx_pages", "tx_creations", "meta", "tx_locks"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    return url


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
