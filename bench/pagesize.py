"""Aerospike page size: what one spend costs as a record holds more outputs (UTXO_BATCH_SIZE).

    AEROSPIKE_HOSTS=127.0.0.1:3000 python -m bench.pagesize [--spends N]

Every spend runs the Lua module on the record that holds the output, which reads and rewrites
the whole record: its cost grows with the record's size. For each page size a transaction of
that many outputs is created, then N of its outputs are spent by N one-input transactions, in
batches of 200 (as a block's spends go), and spends/s is timed. `record_kb_spent` is a fully
spent record's slots (68 bytes an output), to hold against the server's record-size limit
(1 MiB by default). The sets it makes are emptied at the end. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

from chain import Tx, TxIn
from chain.build import build_tx, p2pkh, spend_input
from stores.utxo import open_utxo_store

SIZES = (128, 512, 1024, 2048, 4096, 8192, 14000)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pagesize", description=__doc__.split("\n")[0])
    ap.add_argument("--spends", type=int, default=2000)
    args = ap.parse_args(argv)
    hosts = os.environ.get("AEROSPIKE_HOSTS")
    if not hosts:
        raise SystemExit("bench: AEROSPIKE_HOSTS is needed (e.g. 127.0.0.1:3000)")
    ns = os.environ.get("AEROSPIKE_NAMESPACE", "test")
    out: dict[str, object] = {"bench": "pagesize", "spends": args.spends}
    for size in SIZES:
        name = f"bpage{uuid.uuid4().hex[:8]}"
        store = open_utxo_store(f"aerospike://{hosts}/{ns}?set={name}", batch_size=size)
        try:
            fund = build_tx([TxIn(b"\x01" * 32, 0, b"\x51", 0xFFFFFFFF, 10**12, p2pkh(b"\x00" * 20))],
                            [(1000, p2pkh(v.to_bytes(20, "big"))) for v in range(size)])  # fmt: skip
            store.create_many([fund], 1)
            n = min(args.spends, size)
            txs: list[Tx] = [build_tx([spend_input(fund, v)], [(500, p2pkh(b"\x02" * 20))]) for v in range(n)]
            t0 = time.perf_counter()
            for k in range(0, n, 200):
                bad = [r for r in store.spend_many(txs[k : k + 200], 2) if isinstance(r, Exception)]
                if bad:
                    raise SystemExit(f"bench: spend refused: {bad[0]}")
            rate = n / (time.perf_counter() - t0)
        finally:
            store.conn.client.truncate(ns, name, 0)  # type: ignore[attr-defined]
            store.close()
        out[f"spends_per_s_{size}"] = round(rate)
        out[f"record_kb_spent_{size}"] = round(size * 68 / 1024, 1)
        print(f"{size:>6} outputs a record: {rate:,.0f} spends/s, {size * 68 / 1024:,.1f} KB spent",
              file=sys.stderr, flush=True)  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
