"""Cost as the store grows: one long generated chain through the store (an in-process
`Sequencer`, as `bench.pipeline`'s store-only run), timed block by block.

    python -m bench.scale [--backend sqlite|postgresql] [--blocks N] [--txs-per-block N]

The chain is `bench.pipeline`'s (a snapshot, then blocks of 2-in/2-out transactions spending the
previous block's outputs), by default 200 blocks × 2,000 txs: 400,000 transactions, every one
of them staying in the store (nothing is pruned). `first_quarter_tx_per_s` … `last_quarter_tx_per_s`
are the rates over each quarter of the blocks; `flatness` is the last quarter's over the first's
(target ≥ 0.9). These machines are shared and their speed drifts by tens of percent within a
minute, so after every block a fixed piece of work (parsing the first block again) is timed
too, in this process and in a fresh process beside it; `flatness_vs_reference` and
`flatness_vs_other_process` divide each quarter's rate by the reference's rate over the same
quarter. The other process sees only the machine's drift; this one sees that and whatever its
own growing heap costs every piece of work. Blocks are generated and kept in
memory before the clock starts; each block's time is its `submit` (parse, index, apply). The
last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pipeline import ROOT, SNAPSHOT_HEIGHT, fresh_stores, generate, seed
from bench.store import database, log, peak_rss_mb
from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.utxo import open_utxo_store
from stores.utxo.gcpause import tune_for_blocks
from workers.chainstate.blockindex import parse_block_fast
from workers.chainstate.sequencer import Sequencer

# The reference in a process of its own: it reads the first block's hex from stdin, then for
# every line it reads, parses the block and writes the seconds it took.
PROBE = """
import sys, time
from workers.chainstate.blockindex import parse_block_fast
raw = bytes.fromhex(sys.stdin.readline())
for _ in sys.stdin:
    t = time.perf_counter()
    parse_block_fast(raw)
    print(time.perf_counter() - t, flush=True)
"""


def timed_blocks(urls: dict[str, str], raws: list[bytes]) -> tuple[list[float], list[float], list[float]]:
    """Seconds per block, applied in order by a Sequencer in this process; and the seconds of
    the reference work timed after each, in this process and in a fresh one beside it (which
    the store's growth cannot reach: only the machine's drift)."""
    tune_for_blocks()  # as in a worker process (workers/runtime/services.py)
    utxo = open_utxo_store(urls["store"], blob_url=urls["blobs"])
    state = open_state_store(urls["state"])
    seq = Sequencer(utxo, state, open_blob_store(urls["blobs"]))
    probe = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert probe.stdin is not None and probe.stdout is not None
    probe.stdin.write(raws[0].hex() + "\n")
    times: list[float] = []
    refs: list[float] = []
    others: list[float] = []
    try:
        for k, raw in enumerate(raws):
            t0 = time.perf_counter()
            seq.submit(raw)
            t1 = time.perf_counter()
            parse_block_fast(raws[0])
            refs.append(time.perf_counter() - t1)
            times.append(t1 - t0)
            probe.stdin.write("\n")
            probe.stdin.flush()
            others.append(float(probe.stdout.readline()))
            if (k + 1) % 25 == 0:
                log(f"  {k + 1} blocks, {sum(times):.1f} s")
        tip = state.tip()
        if tip is None or tip.height != SNAPSHOT_HEIGHT + len(raws):
            raise SystemExit(f"bench: the chain stopped at {tip}")
        return times, refs, others
    finally:
        probe.kill()
        probe.wait()
        utxo.close()
        state.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--txs-per-block", type=int, default=2000)
    args = ap.parse_args(argv)
    if args.blocks < 4 or args.txs_per_block <= 0:
        ap.error("--blocks must be at least 4 (quarters) and --txs-per-block positive")
    log(f"generating {args.blocks} blocks of {args.txs_per_block:,} txs …")
    entries, raws, n = generate(args.blocks, args.txs_per_block)
    with tempfile.TemporaryDirectory(prefix="utxoflow-bench-scale-") as d, database(args.backend) as url:
        urls = fresh_stores(url, Path(d), "scale")
        seed(urls, entries)
        log("applying …")
        times, refs, others = timed_blocks(urls, raws)
    q = len(times) // 4
    per_block = args.txs_per_block
    rates = [per_block * q / sum(times[i * q : (i + 1) * q]) for i in range(4)]
    ref_rates = [q / sum(refs[i * q : (i + 1) * q]) for i in range(4)]
    other_rates = [q / sum(others[i * q : (i + 1) * q]) for i in range(4)]
    result: dict[str, Any] = {
        "bench": "scale", "backend": args.backend, "blocks": args.blocks,
        "txs_per_block": args.txs_per_block, "txs": n,
        "tx_per_s": round(n / sum(times)),
        "first_quarter_tx_per_s": round(rates[0]),
        "second_quarter_tx_per_s": round(rates[1]),
        "third_quarter_tx_per_s": round(rates[2]),
        "last_quarter_tx_per_s": round(rates[3]),
        "flatness": round(rates[3] / rates[0], 3),
        "reference_last_vs_first": round(ref_rates[3] / ref_rates[0], 3),
        "flatness_vs_reference": round((rates[3] / ref_rates[3]) / (rates[0] / ref_rates[0]), 3),
        "other_process_reference_last_vs_first": round(other_rates[3] / other_rates[0], 3),
        "flatness_vs_other_process": round((rates[3] / other_rates[3]) / (rates[0] / other_rates[0]), 3),
        "target_flatness": 0.9,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    log(f"{args.backend}: {result['tx_per_s']:,} tx/s over {n:,} txs; quarters "
        f"{' / '.join(f'{r:,.0f}' for r in rates)} tx/s (last / first {result['flatness']}, "
        f"{result['flatness_vs_reference']} against the reference work)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
