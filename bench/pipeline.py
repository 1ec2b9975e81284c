"""End-to-end throughput: a generated chain through real worker processes, against the same
blocks applied by the store alone (an in-process sequencer) in the same run.

    python -m bench.pipeline [--backend sqlite|postgresql] [--workers N] [--blocks N]
                             [--txs-per-block N] [--redis URL]

The chain starts from a UTXO snapshot (so its first block has outputs to spend); every block
holds one coinbase and N 2-in/2-out transactions spending the previous block's outputs.
`store_only_tx_per_s` applies the blocks with a `Sequencer` in this process on fresh stores;
`tx_per_s` enqueues them (`workers.ingest.submit_block`: blob, registry, message) to N
`utxo worker` processes and waits for the tip, on other fresh stores. The broker is an empty
database of the Redis at `--redis` (default `UTXO_BROKER_URL`) that the run claims, as `utxo demo`
does: it never uses the URL's own database or one holding data, and empties only the one it
claimed. Peak RSS is per worker (main process and pool children, the largest). The last line
of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.store import database, log
from chain import Tx, TxIn, parse_block
from chain.build import build_block, build_tx, coinbase_tx, p2pkh, spend_input
from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.utxo import Utxo, open_utxo_store
from workers.localredis import claim_database
from workers.sequencer import Sequencer

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT_HEIGHT = 1000
SNAPSHOT_HASH = b"\x5b" * 32


def generate(blocks: int, per_block: int) -> tuple[list[Utxo], list[bytes], int]:
    """Snapshot entries, raw blocks, and the number of non-coinbase txs."""
    funding = [(i.to_bytes(32, "big"), 0) for i in range(1, 2 * per_block + 1)]
    entries = [Utxo(t, v, 10**8, p2pkh(t[-20:]), SNAPSHOT_HEIGHT, False) for t, v in funding]
    pool: deque[TxIn] = deque(TxIn(t, v, b"\x51", 0xFFFFFFFF, 10**8, p2pkh(t[-20:])) for t, v in funding)
    raws: list[bytes] = []
    parent = SNAPSHOT_HASH
    n = 0
    for k in range(blocks):
        height = SNAPSHOT_HEIGHT + 1 + k
        txs: list[Tx] = [coinbase_tx(height, [(50 * 10**8, p2pkh(b"\x01" * 20))], tag=k.to_bytes(4, "big"))]
        for j in range(per_block):
            a, b = pool.popleft(), pool.popleft()
            value = (a.prev_satoshis + b.prev_satoshis - 500) // 2  # type: ignore[operator]
            outs = [(value, p2pkh((j % 2**32).to_bytes(4, "big") * 5)), (value, p2pkh(b"\x02" * 20))]
            tx = build_tx([a, b], outs)
            txs.append(tx)
            pool.append(spend_input(tx, 0))
            pool.append(spend_input(tx, 1))
        raw = build_block(parent, txs, timestamp=1_700_000_000 + height)
        parent = parse_block(raw).hash
        raws.append(raw)
        n += per_block
    return entries, raws, n


def fresh_stores(url: str, tmp: Path, tag: str) -> dict[str, str]:
    blobs = f"file://{tmp}/{tag}-blobs"
    if url.startswith("sqlite"):
        return {
            "store": f"sqlite:///{tmp}/{tag}-utxo.db",
            "state": f"sqlite:///{tmp}/{tag}-state.db",
            "blobs": blobs,
        }
    return {"store": url, "state": url, "blobs": blobs}


def seed(urls: dict[str, str], entries: list[Utxo]) -> None:
    store = open_utxo_store(urls["store"], blob_url=urls["blobs"])
    try:
        store.import_utxos(entries, height=SNAPSHOT_HEIGHT, block_hash=SNAPSHOT_HASH)
    finally:
        store.close()


def store_only(urls: dict[str, str], raws: list[bytes]) -> float:
    utxo = open_utxo_store(urls["store"], blob_url=urls["blobs"])
    state = open_state_store(urls["state"])
    seq = Sequencer(utxo, state, open_blob_store(urls["blobs"]))
    try:
        t0 = time.perf_counter()
        for raw in raws:
            seq.submit(raw)
        elapsed = time.perf_counter() - t0
        tip = state.tip()
        if tip is None or tip.height != SNAPSHOT_HEIGHT + len(raws):
            raise SystemExit(f"bench: store-only run stopped at {tip}")
        return elapsed
    finally:
        utxo.close()
        state.close()


def rss_mb(pid: int) -> float:
    """Peak RSS (VmHWM) of a process and its children, the largest of them."""
    pids = [pid]
    try:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in kids.split()]
    except OSError:
        pass
    best = 0.0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    best = max(best, int(line.split()[1]) / 1024)
        except OSError:
            continue
    return best


def through_workers(
    urls: dict[str, str], raws: list[bytes], workers: int, tmp: Path, redis_url: str
) -> tuple[float, float]:
    # An empty database of the Redis there, claimed for this run and emptied only while the
    # claim is still ours: nobody's data is touched (`workers.localredis`).
    claimed = claim_database(redis_url)
    broker = claimed.url
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "UTXO_STORE_URL": urls["store"],
        "UTXO_STATE_URL": urls["state"], "UTXO_BLOB_URL": urls["blobs"], "UTXO_BROKER_URL": broker,
    }
    procs = []
    for i in range(workers):
        out = open(tmp / f"worker{i}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "-n", f"bench{i}@%h", "-l", "WARNING"],
            env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT,
        ))
    try:
        time.sleep(3.0)  # workers connect
        os.environ.update({k: v for k, v in env.items() if k.startswith("UTXO_")})
        from workers import services as svc_mod
        from workers.ingest import submit_block

        svc_mod.reset()
        svc = svc_mod.services()
        t0 = time.perf_counter()
        for raw in raws:
            submit_block(raw, svc)
        want = SNAPSHOT_HEIGHT + len(raws)
        deadline = time.monotonic() + 1800
        while True:
            tip = svc.state.tip()
            if tip is not None and tip.height == want:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"bench: the workers stopped at {tip} (logs in {tmp})")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        peak = max(rss_mb(p.pid) for p in procs)
        return elapsed, peak
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        claimed.release()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--txs-per-block", type=int, default=2000)
    ap.add_argument(
        "--redis", default=os.environ.get("UTXO_BROKER_URL", "redis://127.0.0.1:6379/0"),
        help="the Redis to run the broker on: the run claims an empty database of it (never the "
        "URL's own, never one holding data) and empties only that one at the end",
    )
    args = ap.parse_args(argv)
    if min(args.workers, args.blocks, args.txs_per_block) <= 0:
        ap.error("--workers, --blocks and --txs-per-block must be positive")
    log(f"generating {args.blocks} blocks of {args.txs_per_block:,} txs …")
    entries, raws, n = generate(args.blocks, args.txs_per_block)
    result: dict[str, Any] = {"bench": "pipeline", "backend": args.backend, "workers": args.workers,
                              "blocks": args.blocks, "txs_per_block": args.txs_per_block, "txs": n}
    with tempfile.TemporaryDirectory(prefix="utxoflow-bench-pipeline-") as d:
        tmp = Path(d)
        with database(args.backend) as url:
            urls = fresh_stores(url, tmp, "alone")
            seed(urls, entries)
            log("store only …")
            alone = store_only(urls, raws)
        with database(args.backend) as url:
            urls = fresh_stores(url, tmp, "workers")
            seed(urls, entries)
            log(f"through {args.workers} workers …")
            piped, peak = through_workers(urls, raws, args.workers, tmp, args.redis)
    result |= {
        "tx_per_s": round(n / piped),
        "store_only_tx_per_s": round(n / alone),
        "ratio": round(alone / piped, 3),
        "seconds": round(piped, 2),
        "store_only_seconds": round(alone, 2),
        "peak_rss_mb": round(peak, 1),
        "target_tx_per_s": 5000,
        "target_ratio": 0.5,
    }
    log(f"{args.backend}: {result['tx_per_s']:,} tx/s through {args.workers} workers, "
        f"{result['store_only_tx_per_s']:,} tx/s store only (ratio {result['ratio']}); "
        f"peak worker RSS {result['peak_rss_mb']} MB")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
