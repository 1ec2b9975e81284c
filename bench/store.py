"""Store throughput: create, spend and mine N synthetic 2-in/2-out transactions in batches.

    python -m bench.store [--backend sqlite|postgresql|aerospike] [--txs N] [--batch B]

Each batch goes through the store's three calls in turn: create its txs (unmined), spend their
inputs (outputs of the previous batch), mark them mined — the path of transactions that reach
the store before their block. (Block application itself now creates a block's new
transactions already mined and marks mined only those the store held before: two calls, not
three; `bench.pipeline` times that path.) In the same run and the same database, the same rows (the
final `txs` rows) are written again as plain `executemany` inserts into a twin table with the
same indexes: that is the local limit, and `ratio` shows how close the store comes to it. On
Aerospike (AEROSPIKE_HOSTS, namespace AEROSPIKE_NAMESPACE or `test`) the limit is plain batch
writes of the same final records into a twin set of the same server; the bench's sets are
truncated at the end. There the store's calls into the client are timed too:
`client_floor_tx_per_s` is the rate the three phases would reach if only those calls took time
(serialising, the wire, the server's work, decoding: the same calls and nothing of the store's
Python), and `client_floor_ratio` the ceiling of `ratio`. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import resource
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chain import Tx, TxIn
from chain.build import build_tx, p2pkh, spend_input
from stores.utxo import BlockInfo, UtxoStore, open_utxo_store

PG_ADMIN = os.environ.get("UTXOFLOW_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generate(n: int, batch: int) -> tuple[list[Tx], list[list[Tx]]]:
    """Funding txs (untimed) and N 2-in/2-out txs in batches; batch k spends batch k-1's outputs."""
    pool_size = 2 * batch
    per_funding = 100
    funding = []
    pool: deque[tuple[Tx, int]] = deque()
    for f in range((pool_size + per_funding - 1) // per_funding):
        parent = (10**9 + f).to_bytes(32, "big")
        tx = build_tx(
            [TxIn(parent, 0, b"\x51", 0xFFFFFFFF, 10**12, p2pkh(b"\x00" * 20))],
            [(1_000_000_000, p2pkh(f.to_bytes(20, "big"))) for _ in range(per_funding)],
        )
        funding.append(tx)
        pool.extend((tx, v) for v in range(per_funding))
    batches: list[list[Tx]] = []
    k = 0
    while k < n:
        txs = []
        for _ in range(min(batch, n - k)):
            a, b = pool.popleft(), pool.popleft()
            ins = [spend_input(a[0], a[1]), spend_input(b[0], b[1])]
            value = (a[0].outputs[a[1]].satoshis + b[0].outputs[b[1]].satoshis - 500) // 2
            tx = build_tx(
                ins, [(value, p2pkh((k % 2**32).to_bytes(4, "big") * 5)), (value, p2pkh(b"\x01" * 20))]
            )
            txs.append(tx)
            pool.append((tx, 0))
            pool.append((tx, 1))
            k += 1
        batches.append(txs)
    return funding, batches


@contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "aerospike":
        yield from _aerospike_set()
        return
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="utxoflow-bench-") as d:
            yield f"sqlite:///{d}/utxo.db"
        return
    import psycopg

    name = f"utxoflow_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _aerospike_set() -> Iterator[str]:
    """A fresh set on the server AEROSPIKE_HOSTS names; it and the store's other sets are
    truncated afterwards (they are this run's alone)."""
    hosts = os.environ.get("AEROSPIKE_HOSTS")
    if not hosts:
        raise SystemExit("bench: --backend aerospike needs AEROSPIKE_HOSTS (e.g. 127.0.0.1:3000)")
    import aerospike

    ns = os.environ.get("AEROSPIKE_NAMESPACE", "test")
    name = f"bench{uuid.uuid4().hex[:8]}"
    try:
        yield f"aerospike://{hosts}/{ns}?set={name}"
    finally:
        host, port = hosts.split(",")[0].rsplit(":", 1)
        client = aerospike.client({"hosts": [(host, int(port))]}).connect()
        for suffix in ("", "_limit"):
            client.truncate(ns, name + suffix, 0)
        client.close()


def aerospike_limit(store: UtxoStore) -> Any:
    """The plain writer of a batch's final records on Aerospike: each record as the store ends
    with it (spent, mined), written with batch_write into a twin set, nothing else; spread over
    the server's service threads, as the store sends a batch of distinct records."""
    from aerospike_helpers.batch import records as br
    from aerospike_helpers.operations import operations as op

    from stores.utxo.aerospike import codec
    from stores.utxo.kernel import create

    s: Any = store
    twin = f"{s.conn.set}_limit"
    client = s.conn.client  # (the client itself: a clock put on the store's later does not see these)

    def write(txs: list[Tx], height: int) -> float:
        make = create.masters(height, [(height, height, 0)], batch_size=s.batch_size, retention=288,
                              dah_height=height, created_at=0)  # fmt: skip
        batch = []
        for tx in txs:
            rec = make(tx, 500)
            rec.utxos = bytearray(
                b"".join(rec.utxos[k : k + 32] + b"\x01" * 36 for k in range(0, len(rec.utxos), 68))
            )
            rec.spent_utxos = rec.total_utxos
            rec.delete_at_height = height + 288
            bins = codec.to_bins(rec, codec.RAW_TX, tx.raw)
            key = (s.conn.namespace, twin, bytearray(tx.txid))
            batch.append(br.Write(key, [op.write(k, v) for k, v in bins.items()]))
        t0 = time.perf_counter()
        spread = {"allow_inline": False, "allow_inline_ssd": False}  # (as the store sends distinct records)
        client.batch_write(br.BatchRecords(batch), spread)
        return time.perf_counter() - t0

    return write


def checkpoint(store: UtxoStore) -> float:
    """Flush SQLite's WAL into the database file, so a timed section pays for all it wrote."""
    s: Any = store
    if not s.url.startswith("sqlite"):
        return 0.0
    t0 = time.perf_counter()
    s.db.outside("PRAGMA wal_checkpoint(TRUNCATE)")
    return time.perf_counter() - t0


def limit_rows(txs: list[Tx], height: int, ids: Iterator[int]) -> list[tuple[Any, ...]]:
    """The rows the store ends with for these txs (spent, mined), ready for a plain insert."""
    from stores.utxo.kernel.create import tx_slots

    rows = []
    for tx in txs:
        packed, n = tx_slots(tx)
        spent = b"".join(packed[k : k + 32] + b"\x01" * 36 for k in range(0, len(packed), 68))
        rows.append(
            (
                next(ids),
                tx.txid,
                tx.version,
                tx.locktime,
                500,
                tx.size,
                0,
                0,
                0,
                0,
                0,
                None,
                0,
                None,
                height + 288,
                0,
                0,
                n,
                n,
                f"[[{height},{height},0]]",
                b"",
                b"",
                "[]",
                "{}",
                b"\x00" * 72,
                spent,
                b"\x00" * (8 * len(tx.outputs)),
                1,
                tx.raw,
            )
        )
    return rows


def run(store: UtxoStore, funding: list[Tx], batches: list[list[Tx]]) -> tuple[dict[str, float], float]:
    """Per batch, alternately: the store's three phases, then the same final rows as plain
    executemany inserts into a twin table. Alternating keeps both under the same machine
    conditions and database size. On SQLite each side then checkpoints the WAL it wrote, inside
    its own timing, so neither pays for the other's pages."""
    from stores.utxo.sql import schema
    from stores.utxo.sql.codec import INSERT_TX

    s: Any = store
    if s.url.startswith("aerospike"):
        return run_aerospike(store, funding, batches)
    sqlite = s.url.startswith("sqlite")
    if sqlite:
        s.db.outside("PRAGMA wal_autocheckpoint=0")

    def twin(cur: Any) -> None:
        cur.execute("DROP TABLE IF EXISTS bench_txs")
        blob, bigint, opts = (
            ("BLOB", "INTEGER", "") if sqlite else ("BYTEA", "BIGINT", " WITH (fillfactor = 85)")
        )
        cur.execute(schema.TXS.format(blob=blob, bigint=bigint, opts=opts).replace("txs (", "bench_txs (", 1))
        for ix in schema.INDEXES:
            cur.execute(ix.replace("EXISTS txs_", "EXISTS bench_txs_").replace(" ON txs ", " ON bench_txs "))

    s.db.write("bench twin table", twin)
    insert = s.db.q(
        INSERT_TX.replace("INTO txs", "INTO bench_txs").replace(" ON CONFLICT (txid) DO NOTHING", "")
    )
    store.create_many(funding, 1, [BlockInfo(0, 1)])
    checkpoint(store)
    t = {"create": 0.0, "spend": 0.0, "mine": 0.0, "checkpoint": 0.0}
    limit = 0.0
    ids = itertools.count(1)
    for height, txs in enumerate(batches, start=2):
        t0 = time.perf_counter()
        created = store.create_many(txs, height, meta=False)  # as block application asks it
        t1 = time.perf_counter()
        spent = store.spend_many(txs, height)
        t2 = time.perf_counter()
        mined = store.set_mined_multi([tx.txid for tx in txs], height, height)
        t3 = time.perf_counter()
        t["checkpoint"] += checkpoint(store)
        bad = [r for r in (*created, *spent, *mined) if isinstance(r, Exception)]
        if bad:
            raise SystemExit(f"bench: store refused work: {bad[0]}")
        t["create"] += t1 - t0
        t["spend"] += t2 - t1
        t["mine"] += t3 - t2
        rows = limit_rows(txs, height, ids)  # built untimed: the limit is the database's

        def unit(cur: Any, rows: list[Any] = rows) -> None:
            cur.executemany(insert, rows)

        t0 = time.perf_counter()
        s.db.write("bench limit", unit)
        limit += time.perf_counter() - t0 + checkpoint(store)
    return t, limit


def apply_batch(store: UtxoStore, txs: list[Tx], height: int, t: dict[str, float]) -> None:
    """One batch through the store's three calls: create, spend, mine, each phase timed."""
    t0 = time.perf_counter()
    created = store.create_many(txs, height, meta=False)
    t1 = time.perf_counter()
    spent = store.spend_many(txs, height)
    t2 = time.perf_counter()
    mined = store.set_mined_multi([tx.txid for tx in txs], height, height)
    t3 = time.perf_counter()
    bad = [r for r in (*created, *spent, *mined) if isinstance(r, Exception)]
    if bad:
        raise SystemExit(f"bench: store refused work: {bad[0]}")
    t["create"] += t1 - t0
    t["spend"] += t2 - t1
    t["mine"] += t3 - t2


class _ClientClock:
    """The Aerospike client, each of its calls timed: the seconds spent inside the client
    (serialising, the wire, the server, decoding the answer) and none in the store's Python."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return call


def run_aerospike(
    store: UtxoStore, funding: list[Tx], batches: list[list[Tx]]
) -> tuple[dict[str, float], float]:
    """`run` on Aerospike: per batch, the store's three phases, then the limit's plain writes.
    The store's client calls are timed as they go (`in_client`: the phases' floor, what they
    would take with no Python of the store's at all; a call costs the clock well under a
    microsecond, and a phase makes a few calls per batch)."""
    write = aerospike_limit(store)
    store.create_many(funding, 1, [BlockInfo(0, 1)])
    s: Any = store
    clock = s.conn.client = _ClientClock(s.conn.client)
    t = {"create": 0.0, "spend": 0.0, "mine": 0.0, "checkpoint": 0.0}
    limit = 0.0
    try:
        for height, txs in enumerate(batches, start=2):
            apply_batch(store, txs, height, t)
            limit += write(txs, height)  # (through the client itself, not the clock)
    finally:
        s.conn.client = clock._client
    t["in_client"] = clock.seconds
    t["client_calls"] = clock.calls
    return t, limit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "aerospike"], default="sqlite")
    ap.add_argument("--txs", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=5_000, help="txs per batch (one block's worth)")
    args = ap.parse_args(argv)
    if args.txs <= 0 or args.batch <= 0:
        ap.error("--txs and --batch must be positive")
    log(f"generating {args.txs:,} txs in batches of {args.batch:,} …")
    funding, batches = generate(args.txs, args.batch)
    # The generated transactions are set-up, not the store's work: move them out of the cyclic
    # GC's reach, or every full collection during the run would re-scan a million objects.
    gc.collect()
    gc.freeze()
    with database(args.backend) as url:
        store = open_utxo_store(url)
        try:
            phases, limit_s = run(store, funding, batches)
        finally:
            store.close()
    n = args.txs
    in_client = phases.pop("in_client", None)
    client_calls = phases.pop("client_calls", None)
    total = sum(phases.values())  # includes the store's WAL checkpoints, as the limit includes its own
    result = {
        "bench": "store",
        "backend": args.backend,
        "txs": n,
        "batch": args.batch,
        "create_tx_per_s": round(n / phases["create"]),
        "spend_tx_per_s": round(n / phases["spend"]),
        "mine_tx_per_s": round(n / phases["mine"]),
        "tx_per_s": round(n / total),
        "limit_tx_per_s": round(n / limit_s),
        "ratio": round((n / total) / (n / limit_s), 3),
        **({} if in_client is None else {
            "client_floor_tx_per_s": round(n / in_client),
            "client_floor_ratio": round(limit_s / in_client, 3), "client_calls": client_calls,
        }),
        "target_tx_per_s": 20_000,
        "target_ratio": round(1 / 3, 3),
        "checkpoint_s": round(phases["checkpoint"], 3),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    log(
        f"{args.backend}: create {result['create_tx_per_s']:,}/s, spend {result['spend_tx_per_s']:,}/s, "
        f"mine {result['mine_tx_per_s']:,}/s → combined {result['tx_per_s']:,} tx/s; plain inserts "
        f"{result['limit_tx_per_s']:,} tx/s (ratio {result['ratio']}); peak RSS {result['peak_rss_mb']} MB"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
