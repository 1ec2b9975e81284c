"""`utxo demo`: the store at work on a real block (the full pipeline demo comes with the workers).

Seeds a fresh store with the outputs block 413567 spends, as a snapshot at 413566, then applies
the block the way the pipeline will: create every transaction, spend every input, mark every
transaction mined. It checks that the fees add up to the coinbase's outputs minus the 25 BTC
subsidy and prints one JSON summary.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from chain import Tx, parse_block, parse_header
from stores.utxo import UtxoError, UtxoStore, open_utxo_store
from workers.cli.app import BadInput, Context, cli, emit
from workers.cli.progress import Reporter
from workers.cli.snapshot import import_snapshot
from workers.settings import mask_url

HEIGHT = 413567
SUBSIDY = 25 * 100_000_000
BLOCK_FILE = f"mainnet-{HEIGHT}.block"
PREVOUTS_FILE = f"mainnet-{HEIGHT}.prevouts.jsonl"
BLOCK_ID = 1
CHUNK = 100  # transactions per store call: small enough for a progress bar that moves

T = TypeVar("T")


def default_data_dir() -> Path:
    """UTXOFLOW_DATA, else shared/data beside the repository this package lives in."""
    env = os.environ.get("UTXOFLOW_DATA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]  # workers/cli/demo.py → the repository
    return repo.parent / "shared" / "data"


def _chunks(seq: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def _raise_first(results: Sequence[Any]) -> None:
    for r in results:
        if isinstance(r, UtxoError):
            raise r


def apply_block(store: UtxoStore, txs: list[Tx], height: int, rep: Reporter) -> list[int | None]:
    """Create, spend, set mined: the three phases of applying a block. Returns each tx's fee."""
    fees: list[int | None] = []
    with rep.step("create", len(txs), "txs") as advance:
        for part in _chunks(txs):
            created = store.create_many(part, height)
            _raise_first(created)
            fees += [getattr(m, "fee", None) for m in created]
            advance(len(part))
    with rep.step("spend", len(txs), "txs") as advance:
        for part in _chunks(txs):
            _raise_first(store.spend_many(part, height))
            advance(len(part))
    with rep.step("set mined", len(txs), "txs") as advance:
        for part in _chunks(txs):
            txids = [t.txid for t in part]
            _raise_first(store.set_mined_multi(txids, block_id=BLOCK_ID, block_height=height))
            advance(len(part))
    store.set_block_height(height)
    return fees


def run_demo(store: UtxoStore, data: Path) -> dict[str, Any]:
    block_path, prevouts_path = data / BLOCK_FILE, data / PREVOUTS_FILE
    for p in (block_path, prevouts_path):
        if not p.is_file():
            raise BadInput(f"demo data not found: {p} (set --data or UTXOFLOW_DATA to shared/data)")
    started = time.perf_counter()
    with Reporter() as rep:
        raw = block_path.read_bytes()
        parent = parse_header(raw).prev_hash  # the snapshot is taken at the block's parent
        with open(prevouts_path, "rb") as f:
            import_snapshot(store, f, HEIGHT - 1, parent, PREVOUTS_FILE, rep)
        with rep.step("parse block", 1, "blocks") as advance:
            block = parse_block(raw)
            root, mutated = block.computed_merkle_root()
            if root != block.header.merkle_root or mutated:
                raise BadInput(f"{block_path}: the merkle root does not match the transactions")
            advance(1)
        applied = time.perf_counter()
        fees = apply_block(store, block.txs, HEIGHT, rep)
        apply_seconds = time.perf_counter() - applied
    coinbase, rest = block.txs[0], block.txs[1:]
    if None in fees[1:]:
        missing = block.txs[fees.index(None, 1)].txid_hex
        raise BadInput(f"the fee of tx {missing} is unknown: the snapshot lacks one of its inputs")
    fee_total = sum(f or 0 for f in fees[1:])
    claimed = sum(o.satoshis for o in coinbase.outputs) - SUBSIDY
    if fee_total != claimed:
        raise BadInput(f"fees add up to {fee_total} satoshis, the coinbase claims {claimed}")
    stats = store.stats()
    return {
        "block": block.hash_hex,
        "height": HEIGHT,
        "txs": len(block.txs),
        "inputs": sum(len(t.inputs) for t in rest),
        "fees": fee_total,
        "tx_per_s": round(len(block.txs) / apply_seconds, 1) if apply_seconds > 0 else None,
        "utxos": stats.utxos,
        "satoshis": stats.satoshis,
        "store": mask_url(store.url),
        "seconds": round(time.perf_counter() - started, 3),
    }


@cli.command("demo")
@click.option(
    "--data", type=click.Path(file_okay=False, path_type=Path),
    help="Directory of the bundled mainnet data (default: UTXOFLOW_DATA, else ../shared/data).",
)
@click.option("--store-url", metavar="URL", help="An empty store to use (default: a temporary SQLite store).")
@click.pass_obj
def demo_cmd(obj: Context, data: Path | None, store_url: str | None) -> None:
    """Apply mainnet block 413567 to a fresh store and print a summary.

    The store starts from a snapshot of the outputs the block spends (taken at 413566); the
    command checks that the fees equal the coinbase's outputs minus the 25 BTC subsidy. The
    store is --store-url (here or before the command), never UTXO_STORE_URL: the demo needs
    an empty store, and by default makes a temporary one that is removed afterwards.
    """
    url = store_url or obj.overrides.get("store_url")
    s = obj.settings
    with tempfile.TemporaryDirectory(prefix="utxo-demo-") as tmp:
        store = open_utxo_store(
            url or f"sqlite:///{tmp}/utxo.db", retention=s.block_height_retention, batch_size=s.batch_size
        )
        try:
            summary = run_demo(store, data or default_data_dir())
        finally:
            store.close()
    emit(summary)
