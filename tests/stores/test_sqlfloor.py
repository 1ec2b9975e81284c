"""`bench.sqlfloor` records every statement a SQLite store runs: replayed alone on the copy taken
before, they leave that copy exactly as the store left its own database (every table, row for
row). A statement the recorder missed would show as a difference here."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from bench.sqlfloor import Recorder
from stores.utxo import BlockInfo, open_utxo_store
from tests.stores.helpers import child, funding


def tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with closing(sqlite3.connect(path)) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: sorted(conn.execute(f"SELECT * FROM {n}").fetchall(), key=repr) for n in names}


def test_a_replay_leaves_the_copy_as_the_store_left_its_database(tmp_path: Path) -> None:
    store = open_utxo_store(f"sqlite:///{tmp_path}/utxo.db", retention=2)
    try:
        fund = [funding(3, 10_000 + i) for i in range(4)]
        store.create_many(fund, 5, [BlockInfo(1, 5)])
        recorder = Recorder(store, tmp_path / "copy.db")
        try:
            kids = [child((f, 0), (f, 1), n_outputs=2) for f in fund]
            assert not [r for r in store.create_many(kids, 6, meta=False) if isinstance(r, Exception)]
            assert not [r for r in store.spend_many(kids, 6) if isinstance(r, Exception)]
            store.set_mined_multi([k.txid for k in kids], 6, 6)
            grand = child((kids[0], 0), (kids[1], 1))
            store.create_many([grand], 7, [BlockInfo(2, 7)])
            store.spend_many([grand], 7)
        finally:
            recorder.stop()
        before = tables(tmp_path / "copy.db")
    finally:
        store.close()
    counts = recorder.counts()
    assert counts["INSERT"] >= len(kids) + 1 and counts["UPDATE"] >= len(fund)
    live = tables(tmp_path / "utxo.db")
    assert len(live["txs"]) == len(fund) + len(kids) + 1
    assert before["txs"] != live["txs"]  # the copy starts behind
    # each replay runs on a fresh copy of the copy, which stays as it was
    for k in range(2):
        assert recorder.replay(keep_as=tmp_path / f"replayed{k}.db") > 0
        assert tables(tmp_path / f"replayed{k}.db") == live
        assert tables(tmp_path / "copy.db") == before
