"""A sequencer over real stores: SQLite or PostgreSQL UTXO and state stores, file blobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.utxo import open_utxo_store
from workers.sequencer import Sequencer

BACKENDS = ["sqlite", "postgresql"]
TABLES = (
    "txs", "tx_pages", "tx_creations", "meta", "tx_locks", "blocks", "chain", "undo", "leases", "pending",
    "chunks",
)


@pytest.fixture(params=BACKENDS)
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/utxo.db", f"sqlite:///{tmp_path}/state.db"
    url: str = request.getfixturevalue("pg_url")
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    return url, url


@pytest.fixture
def seq(urls: tuple[str, str], tmp_path: Path) -> Iterator[Sequencer]:
    utxo = open_utxo_store(urls[0], blob_url=f"file://{tmp_path}/blobs")
    state = open_state_store(urls[1])
    blobs = open_blob_store(f"file://{tmp_path}/blobs")
    yield Sequencer(utxo, state, blobs)
    utxo.close()
    state.close()
