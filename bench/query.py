"""Script index queries: flat in the store's size.

    python -m bench.query [--backend sqlite|postgresql|aerospike] [--utxos N] [--small N]
                          [--scripts Q] [--per-script K] [--queries R]

A store is filled with `--small` UTXOs, among them K outputs for each of Q query scripts (spread
over the whole fill, as a busy address's outputs are); R listings (`script_utxos`, all pages)
and balances of those scripts are timed; then the store grows to `--utxos` UTXOs of other
scripts and the same queries are timed again. The figures are ms per query at both sizes and
their ratio (`ratio`: ~1 when a query costs what the script owns, not what the store holds),
beside one listing by a full scan of the large store (`iter_utxos`, what `utxo utxos --script`
did before the index) for scale. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Iterator
from hashlib import sha256

from bench.store import database, log, peak_rss_mb
from chain import Tx, TxIn
from chain.build import build_tx, p2pkh
from stores.utxo import BlockInfo, UtxoStore, open_utxo_store

BATCH = 5_000  # txs per create call (a block's worth)
OUTPUTS = 2  # per filler tx


def fill(
    store: UtxoStore, start: int, utxos: int, spks: list[bytes], per_script: int, seq: Iterator[int]
) -> int:
    """Create txs of fresh scripts until about `utxos` UTXOs exist beyond `start`; with
    `per_script`, that many of them, evenly spread, also pay each query script once (so each
    owns `per_script` outputs). Returns the height reached."""
    n_txs = (utxos - start) // OUTPUTS
    every = max(1, n_txs // per_script) if per_script else 0
    height = 1 + start // (BATCH * OUTPUTS)
    batch: list[Tx] = []
    for k in range(n_txs):
        i = next(seq)
        outs = [(1000 + i % 997, p2pkh((i * OUTPUTS + j).to_bytes(20, "big"))) for j in range(OUTPUTS)]
        if every and k % every == 0 and k // every < per_script:
            outs += [(5000 + k // every, spk) for spk in spks]
        parent = (10**12 + i).to_bytes(32, "big")
        batch.append(build_tx([TxIn(parent, 0, b"\x51", 0xFFFFFFFF)], outs))
        if len(batch) == BATCH:
            height += 1
            _create(store, batch, height)
            batch = []
    if batch:
        height += 1
        _create(store, batch, height)
    return height


def _create(store: UtxoStore, txs: list[Tx], height: int) -> None:
    bad = [r for r in store.create_many(txs, height, [BlockInfo(height, height)], meta=False)
           if isinstance(r, Exception)]
    if bad:
        raise SystemExit(f"bench: the store refused a create: {bad[0]}")


def time_queries(store: UtxoStore, hashes: list[bytes], rounds: int) -> tuple[float, float, int]:
    """(ms per listing, ms per balance, outputs per listing) over `rounds` queries."""
    rng = random.Random(7)
    picks = [rng.choice(hashes) for _ in range(rounds)]
    found = 0
    t0 = time.perf_counter()
    for h in picks:
        after: str | None = None
        while True:
            items, after = store.script_utxos(h, after=after, limit=1000)
            found += len(items)
            if after is None:
                break
    t1 = time.perf_counter()
    for h in picks:
        store.script_balance(h)
    t2 = time.perf_counter()
    return (t1 - t0) * 1000 / rounds, (t2 - t1) * 1000 / rounds, found // rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.query", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "aerospike"], default="sqlite")
    ap.add_argument("--utxos", type=int, default=1_000_000, help="UTXOs in the large store")
    ap.add_argument("--small", type=int, default=100_000, help="UTXOs in the small store")
    ap.add_argument("--scripts", type=int, default=50, help="query scripts")
    ap.add_argument("--per-script", type=int, default=20, help="outputs of each query script")
    ap.add_argument("--queries", type=int, default=500)
    args = ap.parse_args(argv)
    if not 0 < args.small < args.utxos or args.scripts <= 0 or args.per_script <= 0 or args.queries <= 0:
        ap.error("need 0 < --small < --utxos, and positive --scripts, --per-script and --queries")
    queried = [sha256(b"query %d" % q).digest() for q in range(args.scripts)]
    spks = [p2pkh(q[:20]) for q in queried]
    hashes = [sha256(s).digest() for s in spks]
    seq = iter(range(1, 1 << 62))
    gc.freeze()
    with database(args.backend) as url:
        store = open_utxo_store(url)
        try:
            t0 = time.perf_counter()
            fill(store, 0, args.small, spks, args.per_script, seq)
            log(f"{args.small:,} UTXOs in {time.perf_counter() - t0:.1f} s; querying …")
            small = time_queries(store, hashes, args.queries)
            t0 = time.perf_counter()
            fill(store, args.small, args.utxos, spks, 0, seq)
            log(f"{args.utxos:,} UTXOs in {time.perf_counter() - t0:.1f} s more; querying …")
            large = time_queries(store, hashes, args.queries)
            t0 = time.perf_counter()
            scanned = sum(1 for _u in store.iter_utxos(confirmed=False, script=spks[0]))
            scan_ms = (time.perf_counter() - t0) * 1000
        finally:
            store.close()
    if small[2] != large[2] or scanned != small[2]:
        raise SystemExit(f"bench: listings differ: {small[2]} and {large[2]} per query, {scanned} by scan")
    result = {
        "bench": "query",
        "backend": args.backend,
        "utxos_small": args.small,
        "utxos_large": args.utxos,
        "outputs_per_query": large[2],
        "queries": args.queries,
        "ms_per_query_small": round(small[0], 3),
        "ms_per_query_large": round(large[0], 3),
        "ratio": round(large[0] / small[0], 3),
        "ms_per_balance_small": round(small[1], 3),
        "ms_per_balance_large": round(large[1], 3),
        "balance_ratio": round(large[1] / small[1], 3),
        "ms_per_scan_large": round(scan_ms, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    log(f"{args.backend}: {result['ms_per_query_small']} ms per listing of {large[2]} outputs at "
        f"{args.small:,} UTXOs, {result['ms_per_query_large']} ms at {args.utxos:,} (ratio "
        f"{result['ratio']}); a full scan of the large store: {result['ms_per_scan_large']} ms")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
