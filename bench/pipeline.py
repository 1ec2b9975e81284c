"""End-to-end throughput: a generated chain through the real path — `utxo enqueue block` of a
file, N `utxo worker` processes, `utxo wait` — against the same blocks through the store alone
and a plain SQLite UTXO table, all in the same run.

    python -m bench.pipeline [--backend sqlite|postgresql|aerospike] [--workers N] [--blocks N]
                             [--txs-per-block N] [--redis URL] [--prune]

The chain starts from a UTXO snapshot (so its first block has outputs to spend); every block
holds one coinbase and N 2-in/2-out transactions spending the previous block's outputs. That is
a narrower path than a user's: every spend finds its parent among the records just written (hot
in every cache). `python -m bench.scaleout` is the user's path: a chain from genesis whose
spends reach across the whole set, by worker count.
- `tx_per_s`: from the start of `utxo enqueue block chain.hex` to the return of `utxo wait`,
  with N workers (fresh stores, the snapshot imported untimed).
- `store_only_tx_per_s`: the same blocks through a `Sequencer` in this process (fresh stores).
- `limit_tx_per_s`: plain SQLite, a block a transaction: its outputs inserted into and the
  outputs it spends deleted from a `(txid, vout) → value, script` table (rows built untimed).
- `sql_floor_tx_per_s` (SQLite): the statements a second store-only run sent to the UTXO store,
  recorded, then replayed alone on a copy of its starting database (`bench.sqlfloor`): the best
  store-only could reach with the same statements and no Python at all; `sql_floor_vs_limit` is the
  ceiling of `store_only_vs_limit` (two replays and two more plain limits in turn, the best
  of each, so the machine's drift stays out of it).
- `cpu_s_per_1000_tx`: CPU seconds of the worker processes (main and pool children) while
  the chain went through; `parses_per_block`: the blocks the workers parsed (their log's
  "parsed block" lines, counted) per block, and `parses_per_block_per_process` per block and
  process that parsed it at all (1.0: none parsed twice).
- With `--backend postgresql` or `aerospike` (AEROSPIKE_HOSTS; its state store on SQLite) the
  end-to-end run is made on SQLite too, in the same run: `sqlite_tx_per_s` and `vs_sqlite`.
- With `--prune`, only the end-to-end path, with retention 10, pruning on and off
  (`prune_on_tx_per_s`, `prune_off_tx_per_s`, `on_vs_off`; see `prune_on_off`).
The broker is an empty database of the Redis at `--redis` (default `UTXO_BROKER_URL`) that the
run claims, as `utxo demo` does: it never uses the URL's own database or one holding data, and
empties only the one it claimed. Peak RSS is per worker (main process and pool children, the
largest). The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.sqlfloor import Recorder
from bench.store import database, log
from chain import Tx, TxIn, parse_block
from chain.build import build_block, build_tx, coinbase_tx, p2pkh, spend_input
from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.utxo import Utxo, open_utxo_store
from stores.utxo.gcpause import tune_for_blocks
from workers.chainstate import commitment
from workers.chainstate.sequencer import Sequencer
from workers.demo.localredis import claim_database

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
            "tag": tag,
        }
    if url.startswith("aerospike"):  # a UTXO store only: the state store stays on SQLite
        return {"store": url, "state": f"sqlite:///{tmp}/{tag}-state.db", "blobs": blobs, "tag": tag}
    return {"store": url, "state": url, "blobs": blobs, "tag": tag}


def seed(urls: dict[str, str], entries: list[Utxo]) -> None:
    """The snapshot, as `utxo import-utxos` leaves it: in the store, its commitment in the state
    store (untimed: the import's work, not the chain's)."""
    store = open_utxo_store(urls["store"], blob_url=urls["blobs"])
    try:
        store.import_utxos(entries, height=SNAPSHOT_HEIGHT, block_hash=SNAPSHOT_HASH)
    finally:
        store.close()
    state = open_state_store(urls["state"])
    try:
        state.commit(commitments={SNAPSHOT_HASH: commitment.of_utxos(entries)})
    finally:
        state.close()


def store_only(
    urls: dict[str, str], raws: list[bytes], floor_copy: Path | None = None
) -> tuple[float, Recorder | None]:
    """Seconds the blocks take through a `Sequencer` in this process; with `floor_copy` (SQLite)
    also the UTXO store's statements, recorded to be replayed alone (`bench.sqlfloor`)."""
    tune_for_blocks()  # as in a worker process (workers/runtime/services.py)
    utxo = open_utxo_store(urls["store"], blob_url=urls["blobs"])
    state = open_state_store(urls["state"])
    seq = Sequencer(utxo, state, open_blob_store(urls["blobs"]))
    recorder = None
    try:
        recorder = Recorder(utxo, floor_copy) if floor_copy is not None else None
        t0 = time.perf_counter()
        for raw in raws:
            seq.submit(raw)
        elapsed = time.perf_counter() - t0
        tip = state.tip()
        if tip is None or tip.height != SNAPSHOT_HEIGHT + len(raws):
            raise SystemExit(f"bench: store-only run stopped at {tip}")
    finally:
        if recorder is not None:
            recorder.stop()
        utxo.close()
        state.close()
    return elapsed, recorder


def rss_mb(pid: int) -> float:
    """Peak RSS (VmHWM) of a process and its children, the largest of them."""
    pids = [pid, *children(pid)]
    best = 0.0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    best = max(best, int(line.split()[1]) / 1024)
        except OSError:
            continue
    return best


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def children(pid: int) -> list[int]:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [int(p) for p in out.split()]


def plain_limit(entries: list[Utxo], raws: list[bytes], tmp: Path, name: str = "limit.db") -> float:
    """Seconds plain SQLite takes for the chain's UTXO changes: per block one transaction that
    inserts its outputs and deletes the outputs it spends (rows built before the clock starts)."""
    import sqlite3

    conn = sqlite3.connect(tmp / name, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE utxos (txid BLOB, vout INTEGER, value INTEGER, script BLOB, "
                 "PRIMARY KEY (txid, vout)) WITHOUT ROWID")
    conn.executemany("INSERT INTO utxos VALUES (?, ?, ?, ?)",
                     [(u.txid, u.vout, u.satoshis, u.script) for u in entries])
    work = []
    for raw in raws:
        block = parse_block(raw)
        adds = [(t.txid, v, o.satoshis, o.script) for t in block.txs for v, o in enumerate(t.outputs)]
        dels = [(i.prev_txid, i.prev_vout) for t in block.txs if not t.is_coinbase for i in t.inputs]
        work.append((adds, dels))
    t0 = time.perf_counter()
    for adds, dels in work:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO utxos VALUES (?, ?, ?, ?)", adds)
        conn.executemany("DELETE FROM utxos WHERE txid = ? AND vout = ?", dels)
        conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # it pays for all it wrote, as the store does
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


@dataclass
class Piped:
    seconds: float
    peak_rss_mb: float
    cpu_s: float
    parses: int
    parsed_pairs: int  # distinct (worker, block) pairs parsed


@contextmanager
def running_workers(
    env: dict[str, str], cwd: Path, logs: list[Path], name: str, *options: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One `utxo worker` per log file (named `{name}{i}`, its output in the file), entered once
    every one says it is ready (one that exits first, or none ready within 120 s, ends the bench
    with the logs' place); on leaving, SIGTERM to each (a warm shutdown), and one still there
    after 60 s is killed."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, path in enumerate(logs):
            with open(path, "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "workers.cli", "worker", "-n", f"{name}{i}@%h", *options,
                     "-l", "INFO"],
                    env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while not all(b"ready" in p.read_bytes() for p in logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"bench: the workers did not start (logs in {cwd})")
            time.sleep(0.1)
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def through_workers(
    urls: dict[str, str], raws: list[bytes], workers: int, tmp: Path, redis_url: str,
    extra_env: dict[str, str] | None = None,
) -> Piped:
    # An empty database of the Redis there, claimed for this run and emptied only while the
    # claim is still ours: nobody's data is touched (`workers.demo.localredis`).
    claimed = claim_database(redis_url)
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "UTXO_STORE_URL": urls["store"],
        "UTXO_STATE_URL": urls["state"], "UTXO_BLOB_URL": urls["blobs"], "UTXO_BROKER_URL": claimed.url,
        **(extra_env or {}),
    }
    chain_file = tmp / "chain.hex"
    chain_file.write_text("".join(raw.hex() + "\n" for raw in raws))
    utxo = [sys.executable, "-m", "workers.cli"]
    logs = [tmp / f"{urls['tag']}-worker{i}.log" for i in range(workers)]
    try:
        with running_workers(env, tmp, logs, "bench") as procs:
            cpu0 = sum(cpu_s(p.pid) for p in procs)
            t0 = time.perf_counter()
            for args in (["enqueue", "block", str(chain_file)], ["wait", "--timeout", "3600"]):
                r = subprocess.run([*utxo, *args], env=env, cwd=tmp, capture_output=True, text=True)
                if r.returncode != 0:
                    why = r.stderr.strip()[-500:]
                    raise SystemExit(f"bench: utxo {args[0]} failed: {why} (logs in {tmp})")
            elapsed = time.perf_counter() - t0
            cpu = sum(cpu_s(p.pid) for p in procs) - cpu0
            peak = max(rss_mb(p.pid) for p in procs)
        state = open_state_store(urls["state"])
        try:
            tip = state.tip()
        finally:
            state.close()
        if tip is None or tip.height != SNAPSHOT_HEIGHT + len(raws):
            raise SystemExit(f"bench: utxo wait returned with the tip at {tip} (logs in {tmp})")
    finally:
        claimed.release()
    parsed = [re.findall(r"parsed block ([0-9a-f]{64})", p.read_text(errors="replace")) for p in logs]
    pairs = sum(len(set(x)) for x in parsed)
    return Piped(elapsed, peak, cpu, sum(len(x) for x in parsed), pairs)


PRUNE_RETENTION = 10


def prune_on_off(args: argparse.Namespace, entries: list[Utxo], raws: list[bytes], n: int) -> int:
    """The chain through the workers twice, on fresh stores, with retention 10: pruning on (every
    batch requests a run; the workers' `prune` queue runs them while blocks arrive) and off
    (`UTXO_DISABLE_DAH_CLEANER`); off, on, off, on, the better of each kept."""
    base = {"UTXO_BLOCK_HEIGHT_RETENTION": str(PRUNE_RETENTION)}
    runs: dict[str, list[float]] = {"on": [], "off": []}
    deleted = 0
    with tempfile.TemporaryDirectory(prefix="utxoflow-bench-pipeline-") as d:
        tmp = Path(d)
        for i, mode in enumerate(("off", "on", "off", "on")):
            with database(args.backend) as url:
                urls = fresh_stores(url, tmp, f"prune-{mode}-{i}")
                seed(urls, entries)
                log(f"through {args.workers} workers, pruning {mode} …")
                env = base | ({"UTXO_DISABLE_DAH_CLEANER": "true"} if mode == "off" else {})
                runs[mode].append(through_workers(urls, raws, args.workers, tmp, args.redis, env).seconds)
                if mode == "on":
                    state = open_state_store(urls["state"])
                    try:
                        deleted = max(deleted, sum(j.figures.get("delete", {}).get("deleted", 0)
                                                   for j in state.prune_jobs(1000)))
                    finally:
                        state.close()
    on, off = min(runs["on"]), min(runs["off"])
    result = {
        "bench": "pipeline-prune", "backend": args.backend, "workers": args.workers, "blocks": args.blocks,
        "txs_per_block": args.txs_per_block, "txs": n, "retention": PRUNE_RETENTION,
        "prune_on_tx_per_s": round(n / on), "prune_off_tx_per_s": round(n / off),
        "on_vs_off": round(off / on, 3), "records_pruned_by_wait": deleted,
        "runs_on_s": [round(x, 2) for x in runs["on"]], "runs_off_s": [round(x, 2) for x in runs["off"]],
        "target_on_vs_off": 0.9,
    }
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "aerospike"], default="sqlite")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--txs-per-block", type=int, default=2000)
    ap.add_argument(
        "--redis", default=os.environ.get("UTXO_BROKER_URL", "redis://127.0.0.1:6379/0"),
        help="the Redis to run the broker on: the run claims an empty database of it (never the "
        "URL's own, never one holding data) and empties only that one at the end",
    )
    ap.add_argument("--prune", action="store_true",
                    help=f"compare pruning on and off instead (retention {PRUNE_RETENTION}, so runs delete)")
    args = ap.parse_args(argv)
    if min(args.workers, args.blocks, args.txs_per_block) <= 0:
        ap.error("--workers, --blocks and --txs-per-block must be positive")
    log(f"generating {args.blocks} blocks of {args.txs_per_block:,} txs …")
    entries, raws, n = generate(args.blocks, args.txs_per_block)
    if args.prune:
        return prune_on_off(args, entries, raws, n)
    result: dict[str, Any] = {"bench": "pipeline", "backend": args.backend, "workers": args.workers,
                              "blocks": args.blocks, "txs_per_block": args.txs_per_block, "txs": n}
    with tempfile.TemporaryDirectory(prefix="utxoflow-bench-pipeline-") as d:
        tmp = Path(d)
        log("plain SQLite limit …")
        limit = plain_limit(entries, raws, tmp)
        with database(args.backend) as url:
            urls = fresh_stores(url, tmp, "alone")
            seed(urls, entries)
            log("store only …")
            alone, _ = store_only(urls, raws)
        floor: dict[str, Any] = {}
        if args.backend == "sqlite":  # again, recorded (the recorder's own cost kept out of the above)
            with database(args.backend) as url:
                urls = fresh_stores(url, tmp, "floor")
                seed(urls, entries)
                log("store only, recorded; its statements replayed alone twice, each beside the limit …")
                _, recorder = store_only(urls, raws, tmp / "floor-copy.db")
            assert recorder is not None
            best_limit, best_floor = recorder.beside(
                lambda i: plain_limit(entries, raws, tmp, f"limit-{i}.db")
            )
            floor = {"sql_floor_tx_per_s": round(n / best_floor),
                     "sql_floor_vs_limit": round(best_limit / best_floor, 3)}
        with database(args.backend) as url:
            urls = fresh_stores(url, tmp, "workers")
            seed(urls, entries)
            log(f"through {args.workers} workers …")
            piped = through_workers(urls, raws, args.workers, tmp, args.redis)
        if args.backend != "sqlite":
            with database("sqlite") as url:
                urls = fresh_stores(url, tmp, "sqlite-workers")
                seed(urls, entries)
                log(f"through {args.workers} workers on SQLite …")
                lite = through_workers(urls, raws, args.workers, tmp, args.redis)
            result |= {"sqlite_tx_per_s": round(n / lite.seconds),
                       "vs_sqlite": round(lite.seconds / piped.seconds, 3)}
    result |= {
        "tx_per_s": round(n / piped.seconds),
        "store_only_tx_per_s": round(n / alone),
        "limit_tx_per_s": round(n / limit),
        "ratio": round(alone / piped.seconds, 3),  # end to end / store only
        "store_only_vs_limit": round(limit / alone, 3),
        **floor,
        "cpu_s_per_1000_tx": round(piped.cpu_s / (n / 1000), 3),
        "parses_per_block": round(piped.parses / args.blocks, 2),
        "parses_per_block_per_process": round(piped.parses / max(piped.parsed_pairs, 1), 2),
        "seconds": round(piped.seconds, 2),
        "store_only_seconds": round(alone, 2),
        "peak_rss_mb": round(piped.peak_rss_mb, 1),
        "target_ratio": 0.8,
        "target_store_only_vs_limit": 0.5,
    }
    log(f"{args.backend}: {result['tx_per_s']:,} tx/s through {args.workers} workers, "
        f"{result['store_only_tx_per_s']:,} tx/s store only (ratio {result['ratio']}), plain SQLite "
        f"{result['limit_tx_per_s']:,} tx/s; {result['cpu_s_per_1000_tx']} worker CPU s per 1,000 txs; "
        f"{result['parses_per_block']} parses per block; peak worker RSS {result['peak_rss_mb']} MB")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
