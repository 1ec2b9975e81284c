"""Backends under test: every test that takes `state` (or `state_url`) runs on each of them.

PostgreSQL gets a fresh database per test session (`pg_url` in tests/conftest.py, shared with the
UTXO store tests, whose tables have other names); each test then starts with the state store's
tables dropped. SQLite gets a new file per test.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from stores.state import StateStore, open_state_store
from stores.state.sql import state_tables
from stores.utxo.sqlite import sqlite_path

BACKENDS = ["sqlite", "postgresql"]
TABLES = state_tables()  # (from the DDL: a table added later is dropped too)


@pytest.fixture(params=BACKENDS)
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state.db"
    url: str = request.getfixturevalue("pg_url")
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    return url


@pytest.fixture
def state(state_url: str) -> Iterator[StateStore]:
    s = open_state_store(state_url)
    yield s
    s.close()


def raw_sql(url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement straight through the driver (not the store), committed; its rows."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(sqlite_path(url))
        try:
            rows = conn.execute(sql, tuple(params)).fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(sql.replace("?", "%s"), tuple(params))
        return cur.fetchall() if cur.description else []
