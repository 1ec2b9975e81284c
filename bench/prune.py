"""Pruning throughput: a pruner run deleting N fully spent records, against a plain DELETE of the
same rows in the same run.

    python -m bench.prune [--backend sqlite|postgresql] [--records N] [--per-block T]

The store is filled through its own API (create, spend, mine per block): block k's transactions
each spend the one output of their twin in block k-1 (so every block but the last ends all
spent), and one in eight also spends the first output of a 2-output "payment and change"
transaction (made in the block before) whose second output is never spent: a parent that
stays, and is told of each child deleted (a row update per such child, as in a real chain). Then, in the same
database, the rows of `txs` are copied into a twin table with the same indexes and deleted with
one `DELETE … WHERE delete_at_height <= H` (the limit); the twin is dropped, and one pruner job
at the tip (`Pruner.drive`, chunks in this process) deletes the due records of the store.
On SQLite the same job then runs again on a copy of the store as the first found it, its
statements recorded and replayed alone, twice, each beside another plain DELETE on a copy of
the same start (`bench.sqlfloor`): `sql_floor_records_per_s` (the better replay) is the best
the pruner could do with the same statements and no Python at all, and `sql_floor_ratio` the
ceiling of `ratio` at this chunk size (the better replay against the best of the three plain
DELETEs, so the machine's drift stays out of it). `peak_rss_mb` is taken before that second run.
The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.sqlfloor import Recorder, backup, copy_database, remove_database
from bench.store import database, log, peak_rss_mb
from chain import Tx, TxIn
from chain.build import build_tx, p2pkh, spend_input
from stores.blob import open_blob_store
from stores.state import BlockStatus, open_state_store
from stores.utxo import BlockInfo, UtxoStore, open_utxo_store
from stores.utxo.sql import schema
from workers.pruning.pruner import Pruner, PrunerConfig

RETENTION = 10
TARGET = 0.25


def script(n: int) -> bytes:
    return p2pkh(n.to_bytes(20, "big"))


def fill(store: UtxoStore, records: int, per_block: int) -> int:
    """Fill the store (see the module); the height of its last block. Each block also makes the
    payment-and-change parents the next block spends from (they keep their second output, so
    they stay), which keeps this process small however many records are asked for."""
    blocks = -(-records // per_block) + 1  # the last block stays: nothing spends it
    seeds = [
        build_tx([TxIn((7 << 200 | i).to_bytes(32, "big"), 0, b"\x51", 0xFFFFFFFF)],
                 [(10**8, script(i)) for _ in range(100)])
        for i in range(-(-per_block // 100))
    ]
    tag = 10**9

    def banks(n: int) -> list[Tx]:
        nonlocal tag
        tag += n
        return [build_tx([TxIn((9 << 200 | tag + i).to_bytes(32, "big"), 0, b"\x51", 0xFFFFFFFF)],
                         [(10**6, script(tag + i)), (10**6, script(tag + i))]) for i in range(n)]

    store.set_block_height(1)
    bank = banks(-(-per_block // 8))
    for r in store.create_many([*seeds, *bank], 1, [BlockInfo(1, 1, 0)]):
        assert not isinstance(r, Exception), r
    prev = [(seeds[j // 100], j % 100) for j in range(per_block)]
    t0 = time.monotonic()
    for k in range(blocks):
        h = 2 + k
        txs: list[Tx] = []
        for j in range(per_block):
            ins = [spend_input(*prev[j])]
            value = prev[j][0].outputs[prev[j][1]].satoshis
            if j % 8 == 0:
                b = bank[j // 8]
                ins.append(spend_input(b, 0))
                value += b.outputs[0].satoshis
            tag += 1
            txs.append(build_tx(ins, [(value - 200, script(tag))]))
        bank = banks(-(-per_block // 8))
        store.set_block_height(h)
        for r in store.create_many([*bank, *txs], h, [BlockInfo(h, h, 0)]):
            assert not isinstance(r, Exception), r
        store.spend_many(txs, h)
        prev = [(t, 0) for t in txs]
        if (k + 1) % 20 == 0:
            log(f"filled {k + 1}/{blocks} blocks ({(k + 1) * per_block / (time.monotonic() - t0):,.0f} tx/s)")
    return 1 + blocks


def limit(store: Any, height: int, chunk: int, chunked: bool = True) -> tuple[int, float, float]:
    """Rows deleted and seconds of the plain DELETE on a twin of `txs` (same rows and indexes):
    one statement in one transaction (the limit), and, on a second twin, by id in transactions of
    `chunk` rows (what any chunked deleting pays in commits: for the record; 0 when not
    `chunked`)."""
    db = store.db
    twin = "txs_limit"

    def copy(cur: Any) -> None:
        # The table's own DDL and indexes under another name, the indexes made first so that
        # they grow by inserts in id order as the store's did: an index built after the rows,
        # by a sort, is packed denser than any the store has, and deletes from it faster.
        table = schema.TXS.format(blob=db.blob, bigint=db.bigint, opts="")
        cur.execute(table.replace(" txs (", f" {twin} (", 1))
        for stmt in schema.INDEXES:
            if stmt.startswith("CREATE INDEX"):
                stmt = stmt.replace(" ON txs ", f" ON {twin} ")
                cur.execute(stmt.replace("EXISTS txs_", f"EXISTS {twin}_"))
        cur.execute(f"INSERT INTO {twin} SELECT * FROM txs ORDER BY id")

    def delete(cur: Any) -> int:
        cur.execute(db.q(f"DELETE FROM {twin} WHERE delete_at_height IS NOT NULL AND delete_at_height <= ?"),
                    (height,))
        return int(cur.rowcount)

    db.write("copy the twin", copy)
    t = time.perf_counter()
    n = db.write("plain delete", delete)
    one = time.perf_counter() - t
    db.write("drop the twin", lambda cur: cur.execute(f"DROP TABLE {twin}"))
    if not chunked:
        return n, one, 0.0
    db.write("copy the twin", copy)
    ids = db.read("due ids", lambda cur: [r[0] for r in cur.execute(db.q(
        f"SELECT id FROM {twin} WHERE delete_at_height <= ? ORDER BY delete_at_height, id"), (height,)
    ).fetchall()])
    t = time.perf_counter()
    sql = db.q(f"DELETE FROM {twin} WHERE id = ?")
    for i in range(0, len(ids), chunk):
        part = [(x,) for x in ids[i : i + chunk]]
        db.write("chunked delete", lambda cur, part=part: cur.executemany(sql, part))
    by_id = time.perf_counter() - t
    db.write("drop the twin", lambda cur: cur.execute(f"DROP TABLE {twin}"))
    return n, one, by_id


def run_pruner(store: UtxoStore, state_url: str, tmp: str, tip: int, chunk_size: int) -> tuple[Any, float]:
    """One pruner job at the tip (`Pruner.drive`, chunks in this process): the job and its seconds."""
    state = open_state_store(state_url)
    try:
        h = b"\x01" * 32
        state.add_block(h, b"\x00" * 32, tip, 1, BlockStatus.APPLIED, 1)
        state.set_tip(h)
        pruner = Pruner(store, state, open_blob_store(f"file://{tmp}/blobs"),
                        PrunerConfig(RETENTION, RETENTION // 2, 14400, progress_log_interval=10.0,
                                     chunk_size=chunk_size))
        pruner.request(tip)
        t = time.perf_counter()
        (job,) = pruner.drive()
        elapsed = time.perf_counter() - t
    finally:
        state.close()
    assert job.status == "completed", job
    return job, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--records", type=int, default=1_000_000, help="fully spent records to prune")
    ap.add_argument("--per-block", type=int, default=5000)
    ap.add_argument("--chunk-size", type=int, default=1000, help="UTXO_PRUNER_CHUNK_SIZE")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, database(args.backend) as url:
        store = open_utxo_store(url, retention=RETENTION, blob_url=f"file://{tmp}/blobs")
        t = time.monotonic()
        last = fill(store, args.records, args.per_block)
        fill_s = time.monotonic() - t
        tip = last + RETENTION
        due = len(store.due_page(tip, None, 10**9)[0])
        log(f"filled in {fill_s:.1f} s: {due:,} records due at {tip}")
        n_limit, limit_s, chunked_s = limit(store, tip, args.chunk_size)
        assert n_limit == due, (n_limit, due)
        floor_from = Path(tmp) / "floor-from.db"
        if args.backend == "sqlite":  # the store as the run finds it, for the SQL floor below
            backup(store, floor_from)
        job, prune_s = run_pruner(store, url if args.backend == "postgresql" else f"sqlite:///{tmp}/state.db",
                                  tmp, tip, args.chunk_size)
        deleted = job.figures["delete"]["deleted"]
        assert deleted == due and not store.due_page(tip, None, 1)[0], job.figures
        store.close()
        rss = peak_rss_mb()
        floor: dict[str, Any] = {}
        if args.backend == "sqlite":
            log("the same run again, its statements recorded, then replayed alone …")
            again = open_utxo_store(f"sqlite:///{floor_from}", retention=RETENTION, blob_url=f"file://{tmp}/blobs")
            recorder = Recorder(again, Path(tmp) / "floor-copy.db")
            try:
                job2, _ = run_pruner(again, f"sqlite:///{tmp}/state-floor.db", tmp, tip, args.chunk_size)
            finally:
                recorder.stop()
                again.close()
            assert job2.figures["delete"]["deleted"] == deleted, job2.figures

            def plain_delete(i: int) -> float:  # on a copy of the start the replays have
                scratch = Path(tmp) / f"limit-{i}.db"
                copy_database(recorder.copy, scratch)
                twin_store = open_utxo_store(f"sqlite:///{scratch}", retention=RETENTION,
                                             blob_url=f"file://{tmp}/blobs")
                try:
                    return limit(twin_store, tip, args.chunk_size, chunked=False)[1]
                finally:
                    twin_store.close()
                    remove_database(scratch)

            best_limit, best_floor = recorder.beside(plain_delete)
            best_limit = min(best_limit, limit_s)
            floor = {"sql_floor_records_per_s": round(deleted / best_floor),
                     "sql_floor_ratio": round(best_limit / best_floor, 3)}
    rate, limit_rate = deleted / prune_s, n_limit / limit_s
    print(json.dumps({
        "bench": "prune", "backend": args.backend, "records": deleted, "per_block": args.per_block,
        "chunk_size": args.chunk_size,
        "records_per_s": round(rate), "limit_records_per_s": round(limit_rate),
        "ratio": round(rate / limit_rate, 3),
        "limit_chunked_records_per_s": round(n_limit / chunked_s), **floor, "target_ratio": TARGET,
        "seconds": round(prune_s, 2),
        "limit_seconds": round(limit_s, 2), "fill_seconds": round(fill_s, 1),
        "delete_seconds": job.figures["delete"]["seconds"], "peak_rss_mb": round(rss, 1),
        "target_peak_rss_mb": 512,
    }))


if __name__ == "__main__":
    main()
