"""Block parsing speed: `python -m bench.parse [--block PATH] [--repeat N]`.

Parses one real block (default: mainnet block 413567, 1 MB, 1,557 txs) with every txid, N times,
and in the same run times the hashing floor: sha256d over every transaction's bytes of the same
block, which any parser must pay. The ratio of the two is the parser's own overhead.

Human-readable figures go to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from chain import merkle_root, parse_block, sha256d

TARGET_MS = 50
DEFAULT_BLOCK = "mainnet-413567.block"


def default_block_path() -> Path:
    repo = Path(__file__).resolve().parent.parent
    data = Path(os.environ.get("UTXOFLOW_DATA", repo / "tests" / "data"))
    return data / DEFAULT_BLOCK


def time_ms(fns: list[Callable[[], object]], repeat: int) -> list[list[float]]:
    """Milliseconds per call of each function, `repeat` times, interleaved: on a machine whose
    speed drifts, every function is timed under the same conditions."""
    out: list[list[float]] = [[] for _ in fns]
    clock = time.perf_counter_ns
    for _ in range(repeat):
        for fn, times in zip(fns, out, strict=True):
            t0 = clock()
            fn()
            times.append((clock() - t0) / 1e6)
    return out


def run(path: Path, repeat: int) -> dict[str, object]:
    data = path.read_bytes()
    block = parse_block(data)  # warm-up, and the reference result
    root, mutated = merkle_root([t.txid for t in block.txs])
    merkle_ok = root == block.header.merkle_root and not mutated
    raws = [t.raw for t in block.txs]

    def parse_once() -> None:
        parse_block(data)

    def hash_once() -> None:
        for r in raws:
            sha256d(r)

    parse_ms, floor_ms = time_ms([parse_once, hash_once], repeat)
    med = statistics.median(parse_ms)
    floor = statistics.median(floor_ms)
    n_in = sum(len(t.inputs) for t in block.txs)
    n_out = sum(len(t.outputs) for t in block.txs)
    return {
        "bench": "parse",
        "block": path.name,
        "block_hash": block.hash_hex,
        "bytes": len(data),
        "txs": len(block.txs),
        "inputs": n_in,
        "outputs": n_out,
        "repeat": repeat,
        "ms_per_block": round(med, 3),
        "ms_per_block_min": round(min(parse_ms), 3),
        "ms_per_block_max": round(max(parse_ms), 3),
        "target_ms": TARGET_MS,
        "merkle_ok": merkle_ok,
        "hashlib_floor_ms": round(floor, 3),
        "overhead_ratio": round(med / floor, 2) if floor > 0 else None,
        "mb_per_s": round(len(data) / 1e6 / (med / 1e3), 1) if med > 0 else None,
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.parse", description="Block parsing speed.")
    ap.add_argument(
        "--block",
        type=Path,
        default=None,
        help=f"block file (default: {default_block_path()}; the data dir is $UTXOFLOW_DATA if set)",
    )
    ap.add_argument("--repeat", type=int, default=50, help="parses to time (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    path: Path = args.block if args.block is not None else default_block_path()
    if not path.is_file():
        ap.error(f"block file not found: {path} (pass --block or set UTXOFLOW_DATA)")
    r = run(path, args.repeat)
    err = sys.stderr
    print(
        f"block {r['block']} ({r['bytes']:,} bytes, {r['txs']:,} txs, {r['inputs']:,} inputs, "
        f"{r['outputs']:,} outputs), {r['repeat']} parses",
        file=err,
    )
    print(
        f"  parse_block median {r['ms_per_block']} ms, min {r['ms_per_block_min']} ms, "
        f"max {r['ms_per_block_max']} ms ({r['mb_per_s']} MB/s); target {TARGET_MS} ms",
        file=err,
    )
    print(
        f"  hashing floor (sha256d of every tx) {r['hashlib_floor_ms']} ms median; "
        f"parse is {r['overhead_ratio']}x the floor",
        file=err,
    )
    print(f"  merkle root {'matches' if r['merkle_ok'] else 'DOES NOT MATCH'} the header", file=err)
    print(json.dumps(r), flush=True)
    return 0 if r["merkle_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
