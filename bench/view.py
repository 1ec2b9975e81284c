"""Confirmed-UTXO listing: how fast a large store streams, and that memory stays flat.

    python -m bench.view [--backend sqlite|postgresql] [--utxos N]

Fills a fresh store with N mined outputs (2 per transaction, untimed), then times
`store.iter_utxos()` in this process and `utxo utxos --confirmed` (JSON lines to /dev/null) as a
real CLI process, whose peak RSS shows whether the listing holds the set in memory.
The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.store import database, log, peak_rss_mb
from chain import TxIn
from chain.build import build_tx, p2pkh
from stores.utxo import BlockInfo, open_utxo_store

# `utxo utxos --confirmed`, reporting its own peak RSS at exit. VmHWM is the high-water mark of
# this process image (exec resets it), unlike ru_maxrss, which keeps what the fork copied.
CLI_WITH_RSS = """
import atexit, sys
def report():
    with open("/proc/self/status") as f:
        sys.stderr.write(next(line for line in f if line.startswith("VmHWM:")))
atexit.register(report)
sys.argv = ["utxo", "utxos", "--confirmed"]
from workers.cli import main
main()
"""


def fill(url: str, n_utxos: int) -> None:
    store = open_utxo_store(url)
    try:
        for k in range(0, n_utxos // 2, 10_000):
            txs = [
                build_tx(
                    [TxIn((i + 1).to_bytes(32, "big"), 0, b"\x51", 0xFFFFFFFF, 10**6, b"\x51")],
                    [(1000 + i, p2pkh(i.to_bytes(20, "big"))), (2000, p2pkh(b"\x01" * 20))],
                )
                for i in range(k, min(k + 10_000, n_utxos // 2))
            ]
            store.create_many(txs, 10, [BlockInfo(1, 10)])
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.view", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--utxos", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    if args.utxos < 2:
        ap.error("--utxos must be at least 2")
    with database(args.backend) as url:
        log(f"filling a {args.backend} store with {args.utxos:,} UTXOs …")
        fill(url, args.utxos)
        store = open_utxo_store(url)
        t0 = time.perf_counter()
        n = sum(1 for _ in store.iter_utxos())
        api_s = time.perf_counter() - t0
        store.close()
        env = dict(os.environ, UTXO_STORE_URL=url)
        t0 = time.perf_counter()
        with open(os.devnull, "wb") as sink:
            done = subprocess.run(
                [sys.executable, "-c", CLI_WITH_RSS], stdout=sink, stderr=subprocess.PIPE,
                env=env, check=True, text=True,
            )
        cli_s = time.perf_counter() - t0
        cli_rss = int(done.stderr.rsplit("VmHWM:", 1)[1].split()[0]) / 1024
    result = {
        "bench": "view",
        "backend": args.backend,
        "utxos": n,
        "api_seconds": round(api_s, 2),
        "api_utxos_per_s": round(n / api_s),
        "cli_seconds": round(cli_s, 2),
        "cli_utxos_per_s": round(n / cli_s),
        "cli_peak_rss_mb": round(cli_rss, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    log(f"{n:,} UTXOs: {result['api_seconds']} s through the API, {result['cli_seconds']} s as JSON lines "
        f"from the CLI (peak RSS {result['cli_peak_rss_mb']} MB)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
