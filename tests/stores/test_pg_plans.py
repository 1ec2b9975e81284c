"""PostgreSQL never runs a block's key-set statements on a plan made for another table size.

A statement psycopg prepares on the server (from its sixth run) may get PostgreSQL's generic
plan, built once, for whatever the table was then, and kept until the table's statistics are
invalidated — never, where autovacuum is off. A store's first blocks run on a nearly empty
`txs`: a generic plan made then scans the whole table for every lookup once it holds a chain
(the whole pipeline fell to 722 tx/s). So the statements over a set of keys (`= ANY(…)`,
`unnest(…)`) are planned at every run, for the keys they are given.

The test watches the plans the server really executes (auto_explain, its output sent to this
connection as notices): the store's calls run a dozen times on near-empty tables, the tables
then grow to a realistic size, and the same calls must reach `txs` and `script_utxos` through
their indexes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from stores.utxo import BlockInfo, open_utxo_store
from stores.utxo.sql.store import SqlUtxoStore
from tests.stores.helpers import child, funding

ROWS = 150_000  # the tables' size once grown: a chain's worth of records


@pytest.fixture
def pg_store(pg_url: str, tmp_path: object) -> Iterator[SqlUtxoStore]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for table in ("txs", "tx_pages", "tx_creations", "meta", "tx_locks", "script_utxos"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    s = open_utxo_store(pg_url, retention=288, blob_url=f"file://{tmp_path}/blobs")
    assert isinstance(s, SqlUtxoStore)
    yield s
    s.close()


def _watch_plans(store: SqlUtxoStore) -> list[str]:
    """Every plan the store's connection executes from now on, as text."""
    plans: list[str] = []
    conn = store.db._connect()
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_level = 'notice'")
    conn.execute("SET client_min_messages = 'notice'")
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    return plans


def _block_calls(store: SqlUtxoStore, height: int, n: int = 40) -> None:
    """A small block's worth of the calls block application makes: look the txs and parents
    up, create them mined, spend their inputs, read the spent outputs."""
    parents = [funding(2) for _ in range(n)]
    store.create_many(parents, height - 1, [BlockInfo(height - 1, height - 1, 0)], meta=False)
    kids = [child((p, 0), (p, 1)) for p in parents]
    store.standing([k.txid for k in kids] + [p.txid for p in parents])
    store.get_outputs([(p.txid, v) for p in parents for v in (0, 1)])
    store.create_many(kids, height, [BlockInfo(height, height, 0)], meta=False)
    for r in store.spend_many(kids, height, by_block=True):
        assert isinstance(r, list), r


def _grow(url: str) -> None:
    """`txs` and `script_utxos` to ROWS rows each, copies of a record under made-up txids."""
    with psycopg.connect(url, autocommit=True) as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'txs' "
            "AND column_name NOT IN ('id', 'txid') ORDER BY ordinal_position")]
        listed = ", ".join(cols)
        conn.execute(
            f"INSERT INTO txs (id, txid, {listed}) SELECT nextval('txs_id_seq'), "
            f"sha256(int8send(g)), {listed} FROM (SELECT * FROM txs LIMIT 1) AS t, "
            f"generate_series(1, {ROWS}) AS g")
        conn.execute(
            f"INSERT INTO script_utxos (sh, rid, vout) SELECT g, g, 0 FROM generate_series(1, {ROWS}) AS g "
            "ON CONFLICT DO NOTHING")


def test_key_set_statements_use_the_indexes_once_the_tables_have_grown(
    pg_store: SqlUtxoStore, pg_url: str
) -> None:
    plans = _watch_plans(pg_store)
    # a chain's first blocks, on a table of a few pages: each call twice psycopg's prepare
    # threshold and past PostgreSQL's five custom plans before it settles on one
    for k in range(12):
        _block_calls(pg_store, 200 + 2 * k, n=10)
    _grow(pg_url)
    plans.clear()
    for k in range(3):
        _block_calls(pg_store, 300 + 2 * k)
    keyed = [p for p in plans
             if re.search(r"= ANY\(|unnest\(", p) and re.search(r"\b(txs|script_utxos)\b", p)]
    assert len(keyed) >= 3 * 4, plans  # lookups, reads, spends' row updates, the script index
    scans = [p for p in keyed if re.search(r"Seq Scan on (txs|script_utxos)", p)]
    assert not scans, f"{len(scans)} of {len(keyed)} key-set statements scanned a whole table:\n{scans[0]}"
