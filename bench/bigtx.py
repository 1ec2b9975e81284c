"""One giant transaction: create (two-phase, many pages), spend a few outputs, mine — in bounded memory.

    python -m bench.bigtx [--backend sqlite|postgresql] [--outputs N] [--url STORE_URL] [--data DIR]

Generates one extended transaction with N p2pkh outputs of distinct values, whose parent (a
small funding transaction, created untimed) is in the store. Timed, each on its own: creating
it (more outputs than the store's batch size: the two-phase path, master and child pages),
spending outputs 0, B-1, B and N-1 with one 4-input transaction, and mining both. Its own
input is spent too (`input_spend_s`), the record is read back whole with `store.get`
(`get_s`, after the generated copy is freed), the confirmed view walks all its outputs
(`view_s`) and one output is looked up (`get_output_s`); all outside `seconds`. Then the real
999,657-byte mainnet transaction `mainnet-megatx-bb41a757.tx` (from `--data`, else
`UTXOFLOW_DATA`, else `tests/data`) is created through the external path (larger than the
store's `max_tx_size_in_store`, so its bytes go to the blob store) and read back.

Peak RSS must stay under `rss_limit_mb` for the whole process: the store builds page slots one
page at a time and writes the blob from the transaction's own bytes, and the transaction is
generated with one copy of its outputs, its bytes written into one buffer. `rss_after_mb` gives
the resident set after each step, to find a step that grows it. With `--url` the store at that
URL is used (it must be empty); otherwise a temporary SQLite file or a fresh PostgreSQL
database. Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import struct
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from bench.store import database
from chain import Tx, TxIn, TxOut, parse_tx, utxo_hash
from chain.build import build_tx, p2pkh, spend_input
from chain.tx import serialize, varint
from stores.utxo import BlockInfo, SpendStatus, UtxoStore, open_utxo_store

ROOT = Path(__file__).resolve().parent.parent
RSS_LIMIT_MB = 512
MEGATX = "mainnet-megatx-bb41a757.tx"
BATCH = 20_000  # the SQL stores' default batch size: outputs per record


def batch_for(backend: str) -> int:
    """Outputs per record on `backend`: its default (Aerospike's is its own)."""
    if backend == "aerospike":
        from stores.utxo.aerospike.codec import DEFAULT_BATCH_SIZE

        return DEFAULT_BATCH_SIZE
    return BATCH


FEE = 10_000
VERSION, LOCKTIME = 1, 0
HEIGHT, BLOCK_ID = 2, 2  # the big tx and its spender: created, spent and mined at this height


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """The resident set now (Linux), for the per-step profile; the peak where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def data_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    return Path(os.environ.get("UTXOFLOW_DATA", ROOT / "tests" / "data"))


def generate(n: int, batch: int = BATCH) -> tuple[Tx, Tx, Tx]:
    """(funding, big, spender): funding's only output pays for big's N outputs (values
    1000…1000+N-1, each to its own p2pkh script); spender spends big's outputs 0, B-1, B, N-1.

    The outputs are made once, as TxOut objects, and the big tx's bytes are written straight
    into one buffer (`serialize_outputs`): `build_tx`, which the two small ones use, serializes
    through `chain.tx.serialize`, whose `b"".join` of three parts per output peaks at about
    350 MB more for a million outputs (bytes.join allocates an 80-byte Py_buffer per part)."""
    total = n * 1000 + n * (n - 1) // 2
    funding = build_tx(
        [TxIn((10**9).to_bytes(32, "big"), 0, b"\x51", 0xFFFFFFFF, total + 2 * FEE, p2pkh(b"\x00" * 20))],
        [(total + FEE, p2pkh(b"\xf0" * 20))],
    )
    inputs = [spend_input(funding, 0)]  # extended: it carries the funding output
    outputs = [TxOut(1000 + v, p2pkh(v.to_bytes(20, "big"))) for v in range(n)]
    big = Tx(VERSION, inputs, outputs, LOCKTIME, serialize_big(inputs, outputs))
    vouts = sorted({v for v in (0, batch - 1, batch, n - 1) if 0 <= v < n})
    paid = sum(big.outputs[v].satoshis for v in vouts)
    spender = build_tx([spend_input(big, v) for v in vouts], [(paid - 500, p2pkh(b"\x0f" * 20))])
    return funding, big, spender


def serialize_big(inputs: list[TxIn], outputs: list[TxOut]) -> bytes:
    """The standard bytes `chain.tx.serialize(VERSION, inputs, outputs, LOCKTIME)` gives, built
    in one growing buffer: the head (version and inputs) is `serialize`'s own with no outputs."""
    head = serialize(VERSION, inputs, [], LOCKTIME)[:-5]  # drop varint(0) and the locktime
    buf = bytearray(head)
    buf += varint(len(outputs))
    pack = struct.Struct("<Q").pack
    for o in outputs:
        buf += pack(o.satoshis)
        buf += varint(len(o.script))
        buf += o.script
    buf += struct.pack("<I", LOCKTIME)
    return bytes(buf)


class Steps:
    """Seconds, and the resident set after, of each named step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.rss: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self, name: str) -> float:
        s = self.seconds[name] = time.perf_counter() - self._t0
        self.rss[name] = round(rss_mb(), 1)
        log(f"  {name}: {s:.3f} s (RSS now {self.rss[name]} MB, peak {peak_rss_mb():.1f} MB)")
        return s


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"bench.bigtx: {what}")


def run_big(store: UtxoStore, funding: Tx, big: Tx, spender: Tx, steps: Steps) -> dict[str, Any]:
    """Create, spend and mine the big transaction (timed); check what each step returned and
    the state of the spent outputs and of one unspent output."""
    store.create_many([funding], 1, [BlockInfo(1, 1)])

    steps.start()
    meta = store.create(big, HEIGHT)
    steps.stop("create")
    check(meta.txid == big.txid and not meta.creating, f"create returned {meta.creating=}")

    store.create(spender, HEIGHT)  # untimed: a small one-record tx, so that it can be mined
    steps.start()
    spends = store.spend(spender, HEIGHT)
    steps.stop("spend")
    vouts = [i.prev_vout for i in spender.inputs]
    got = [(s.txid, s.vout, s.spending_txid, s.spending_vin) for s in spends]
    want = [(big.txid, v, spender.txid, vin) for vin, v in enumerate(vouts)]
    check(got == want, f"spend returned {len(got)} spends, not the {len(want)} expected")

    steps.start()
    mined = store.set_mined_multi([big.txid, spender.txid], BLOCK_ID, HEIGHT)
    steps.stop("mine")
    check(mined == [[BLOCK_ID], [BLOCK_ID]], f"set_mined_multi returned {mined}")

    steps.start()
    parent_spends = store.spend(big, HEIGHT)  # its own input: the funding output
    steps.stop("input_spend")
    check(len(parent_spends) == 1 and parent_spends[0].txid == funding.txid, "big tx's input spend failed")

    for s in spends:
        info = store.get_spend((s.txid, s.vout), s.utxo_hash)
        check(
            info.status == SpendStatus.SPENT and info.spending_txid == spender.txid,
            f"output {s.vout}: {info}",
        )
    unspent = big.outputs[1]
    info = store.get_spend((big.txid, 1), utxo_hash(big.txid, 1, unspent.script, unspent.satoshis))
    check(info.status == SpendStatus.OK, f"output 1 should be unspent: {info}")
    return {"spends_ok": True, "spent_vouts": vouts, "tx_bytes": big.size}


def check_record(
    store: UtxoStore, txid: bytes, n: int, spent: int, steps: Steps, batch: int = BATCH
) -> dict[str, Any]:
    """`store.get(txid)` of the big transaction, read back whole from the blob store (timed
    as `get_s`, outside `seconds`; the generated copy is gone by now, so the two are never in
    memory together), and its record checked."""
    steps.start()
    rec = store.get(txid)
    steps.stop("get")
    pages = -(-n // batch)
    check(rec.tx is not None and rec.tx.txid == txid and len(rec.tx.outputs) == n, "get: another tx")
    check(not rec.creating, "record still creating")
    check(rec.spent_utxos == spent, f"spent_utxos {rec.spent_utxos} != {spent}")
    check(rec.total_utxos == n, f"total_utxos {rec.total_utxos} != {n}")
    check(rec.total_extra_recs == pages - 1, f"total_extra_recs {rec.total_extra_recs} != {pages - 1}")
    check(list(rec.block_ids) == [BLOCK_ID], f"block_ids {rec.block_ids}")
    return {
        "spent_utxos": rec.spent_utxos,
        "total_utxos": rec.total_utxos,
        "total_extra_recs": rec.total_extra_recs,
        "creating": rec.creating,
        "external": rec.external,
        "block_ids": list(rec.block_ids),
    }


def run_view(store: UtxoStore, txid: bytes, n: int, spent: list[int], steps: Steps) -> dict[str, Any]:
    """The confirmed view over the big record (every page, outputs walked from its blob) and one
    output looked up on the last page: both in bounded memory, outside `seconds`."""
    steps.start()
    listed = 0
    last = -1
    for u in store.iter_utxos(confirmed=True):
        if u.txid == txid:
            check(u.vout > last, "view: vouts out of order")
            last = u.vout
            listed += 1
    steps.stop("view")
    check(listed == n - len(spent), f"view listed {listed} outputs of the big tx, expected {n - len(spent)}")
    steps.start()
    out = store.get_output((txid, n - 2))
    steps.stop("get_output")
    check(out is not None and out.satoshis > 0 and out.spending_txid is None, "get_output: wrong output")
    return {"view_utxos": listed}


def run_megatx(store: UtxoStore, path: Path, steps: Steps) -> dict[str, Any]:
    raw = path.read_bytes()
    tx = parse_tx(raw)
    check(len(tx.inputs) == 5569, f"{path.name}: {len(tx.inputs)} inputs, expected 5569")

    steps.start()
    meta = store.create(tx, 3)
    steps.stop("megatx_create")
    check(meta.external and not meta.creating, f"megatx: external={meta.external} creating={meta.creating}")

    steps.start()
    back = store.get(tx.txid)
    steps.stop("megatx_get")
    check(back.tx is not None and back.tx.txid == tx.txid, "megatx: get returned another transaction")
    check(back.external and back.fee is None, f"megatx: external={back.external} fee={back.fee}")
    return {"megatx_txid": tx.txid_hex, "megatx_bytes": len(raw), "megatx_ok": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bigtx", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgresql"], default=None)
    ap.add_argument("--outputs", type=int, default=1_000_000)
    ap.add_argument("--url", help="use this (empty) UTXO store instead of a temporary one")
    ap.add_argument("--data", help=f"directory holding {MEGATX} (default: $UTXOFLOW_DATA or tests/data)")
    args = ap.parse_args(argv)
    if args.outputs <= 0:
        ap.error("--outputs must be positive")
    backend = args.backend or "sqlite"
    if args.url:
        scheme = args.url.split("://", 1)[0]
        backend = scheme if scheme in ("sqlite", "aerospike") else "postgresql"
        if args.backend and args.backend != backend:
            ap.error(f"--backend {args.backend} does not match --url {args.url.split('://', 1)[0]}://…")
    megatx = data_dir(args.data) / MEGATX
    if not megatx.is_file():
        ap.error(f"{megatx} not found (set UTXOFLOW_DATA or --data)")

    log(f"generating one tx with {args.outputs:,} outputs …")
    steps = Steps()
    steps.start()
    gc.disable()  # millions of acyclic objects: the collector would only re-scan them
    batch = batch_for(backend)
    funding, big, spender = generate(args.outputs, batch)
    gc.enable()
    gc.collect()
    gc.freeze()  # set-up, not the store's work: keep it out of every later collection
    steps.stop("generate")
    log(f"  {big.size:,} bytes, txid {big.txid_hex}")

    with (
        tempfile.TemporaryDirectory(prefix="utxoflow-bigtx-blobs-") as blobs,
        database(backend) if not args.url else nullcontext(args.url) as url,
    ):
        # The megatx (999,657 bytes) must go to the blob store: the in-store limit sits below it.
        store = open_utxo_store(
            url, batch_size=batch, blob_url=f"file://{blobs}", max_tx_size_in_store=500_000
        )
        try:
            check(store.is_empty(), f"the store at {url} is not empty")
            log(f"{backend}: big tx")
            big_result = run_big(store, funding, big, spender, steps)
            txid, n = big.txid, len(big.outputs)
            del funding, big, spender  # the generated million objects: freed before the read-back
            big_result |= check_record(store, txid, n, len(big_result["spent_vouts"]), steps, batch)
            big_result |= run_view(store, txid, n, big_result["spent_vouts"], steps)
            log(f"{backend}: {MEGATX}")
            mega_result = run_megatx(store, megatx, steps)
        finally:
            store.close()

    t = steps.seconds
    result = {
        "bench": "bigtx",
        "backend": backend,
        "outputs": args.outputs,
        "batch_size": batch,
        "seconds": round(t["create"] + t["spend"] + t["mine"], 3),
        "create_s": round(t["create"], 3),
        "spend_s": round(t["spend"], 3),
        "mine_s": round(t["mine"], 3),
        "input_spend_s": round(t["input_spend"], 3),
        "get_s": round(t["get"], 3),
        "view_s": round(t["view"], 3),
        "get_output_s": round(t["get_output"], 3),
        "megatx_create_s": round(t["megatx_create"], 3),
        "megatx_get_s": round(t["megatx_get"], 3),
        "generate_s": round(t["generate"], 3),
        **big_result,
        **mega_result,
        "rss_after_mb": steps.rss,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "rss_limit_mb": RSS_LIMIT_MB,
    }
    log(
        f"{backend}: {args.outputs:,} outputs: create {result['create_s']} s, spend {result['spend_s']} s, "
        f"mine {result['mine_s']} s (total {result['seconds']} s); "
        f"megatx create {result['megatx_create_s']} s, get {result['megatx_get_s']} s; "
        f"peak RSS {result['peak_rss_mb']} MB (limit {RSS_LIMIT_MB})"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
