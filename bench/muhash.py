"""MuHash3072 speed: `python -m bench.muhash [--created N] [--spent N] [--repeat N]`.

Times `MuHash.update` over one block's worth of random coin serialisations (default 4,000
created and 4,000 spent, as a 2,000-transaction block of two-in two-out payments would have;
P2PKH scripts), N times. In the same run it times the element floor: `element` alone over the
same coins (SHA-256, then 384 bytes of ChaCha20), which any MuHash must pay before it multiplies.

Human-readable figures go to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys

from bench.parse import time_ms
from chain.muhash import MuHash, coin_bytes, element


def random_coins(n: int, rng: random.Random) -> list[bytes]:
    """`n` coin serialisations: random txids, P2PKH scripts, heights and amounts."""
    out = []
    for _ in range(n):
        script = b"\x76\xa9\x14" + rng.randbytes(20) + b"\x88\xac"
        out.append(
            coin_bytes(
                rng.randbytes(32),
                rng.randrange(4),
                rng.randrange(1, 900_000),
                rng.random() < 0.001,
                rng.randrange(546, 10**10),
                script,
            )
        )
    return out


def run(created: int, spent: int, repeat: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    new, old = random_coins(created, rng), random_coins(spent, rng)
    both = new + old
    coins = len(both)
    state = MuHash()
    state.update(random_coins(100, rng), [])  # a non-trivial starting set, as mid-chain

    def update_once() -> None:
        MuHash(state.value).update(new, old)

    def elements_once() -> None:
        for d in both:
            element(d)

    update_ms, floor_ms = time_ms([update_once, elements_once], repeat)
    med = statistics.median(update_ms)
    floor = statistics.median(floor_ms)
    return {
        "bench": "muhash",
        "created": created,
        "spent": spent,
        "coins": coins,
        "coin_bytes": round(sum(map(len, both)) / coins, 1) if coins else 0,
        "repeat": repeat,
        "ms_per_block": round(med, 3),
        "ms_per_block_min": round(min(update_ms), 3),
        "ms_per_block_max": round(max(update_ms), 3),
        "us_per_coin": round(med * 1e3 / coins, 3) if coins else None,
        "ms_per_2000_tx_block": round(med * 8000 / coins, 3) if coins else None,
        "element_us_per_coin": round(floor * 1e3 / coins, 3) if coins else None,
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.muhash", description="MuHash3072 update speed.")
    ap.add_argument("--created", type=int, default=4000, help="coins created (default: %(default)s)")
    ap.add_argument("--spent", type=int, default=4000, help="coins spent (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=7, help="updates to time (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=3072, help="random seed (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.created < 0 or args.spent < 0 or args.created + args.spent == 0:
        ap.error("--created and --spent must be non-negative, and not both 0")
    r = run(args.created, args.spent, args.repeat, args.seed)
    err = sys.stderr
    print(
        f"update over {r['created']:,} created + {r['spent']:,} spent coins "
        f"({r['coin_bytes']} bytes each), {r['repeat']} runs",
        file=err,
    )
    print(
        f"  median {r['ms_per_block']} ms, min {r['ms_per_block_min']} ms, max {r['ms_per_block_max']} ms: "
        f"{r['us_per_coin']} us per coin, {r['ms_per_2000_tx_block']} ms per 2,000-tx block (8,000 coins)",
        file=err,
    )
    print(
        f"  element floor (SHA-256 + ChaCha20, no arithmetic) {r['element_us_per_coin']} us per coin",
        file=err,
    )
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
