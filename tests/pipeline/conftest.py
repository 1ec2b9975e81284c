"""A sequencer over real stores: SQLite or PostgreSQL UTXO and state stores, file blobs; a
PostgreSQL database of its own for a test whose worker processes all connect to one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.state.sql import state_tables
from stores.utxo import open_utxo_store
from tests.aerospike_server import drop_set, new_url
from tests.conftest import PG_ADMIN
from workers.chainstate.sequencer import Sequencer

BACKENDS = ["sqlite", "postgresql"]
TABLES = ("txs", "tx_pages", "tx_creations", "meta", "tx_locks", "script_utxos", *state_tables())


@pytest.fixture(params=BACKENDS)
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/utxo.db", f"sqlite:///{tmp_path}/state.db"
    url: str = request.getfixturevalue("pg_url")
    drop_tables(url)
    return url, url


def drop_tables(url: str) -> None:
    """Drop the stores' tables in the test database `url` (one of the session's own)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.fixture
def seq(urls: tuple[str, str], tmp_path: Path) -> Iterator[Sequencer]:
    utxo = open_utxo_store(urls[0], blob_url=f"file://{tmp_path}/blobs")
    state = open_state_store(urls[1])
    blobs = open_blob_store(f"file://{tmp_path}/blobs")
    yield Sequencer(utxo, state, blobs)
    utxo.close()
    state.close()


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A PostgreSQL database created for this test alone (and dropped after it): the stores of
    a pipeline whose workers all connect to it."""
    name = f"utxoflow_pipe_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.Error as e:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN}: {e} (.ci/run starts it)")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def aerospike_url() -> Iterator[str]:
    """An emptied Aerospike set of the test server (AEROSPIKE_HOSTS), emptied again after."""
    url = new_url()
    yield url
    drop_set(None, url)
