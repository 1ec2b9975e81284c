"""`utxo enqueue block|tx FILE…`: feeding the pipeline. Every file is read and checked whole
before anything is sent (CONTRACT: bad bytes enqueue nothing), then what the store and the broker
can tell up front: blocks that could never join a chain continuing a UTXO snapshot, a broker URL
that cannot work, a broker that does not answer — each refused (exit 2) with nothing enqueued."""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import click

from chain import Tx, hash_to_hex
from stores.sqldb import mask_url
from workers.cli.app import BadInput, Context, cli, emit
from workers.cli.pipeline import _export
from workers.cli.progress import Reporter

if TYPE_CHECKING:
    from workers.runtime.ingest import CheckedBlock
    from workers.runtime.services import Services

T = TypeVar("T")
AHEAD = 3  # parts whose bytes are being stored while the one before them is sent


def _read(path: str) -> tuple[str, bytes]:
    if path == "-":
        return "stdin", sys.stdin.buffer.read()
    with open(path, "rb") as f:
        return path, f.read()


def _parse_all(files: tuple[str, ...], parse: Callable[[bytes, str], list[T]]) -> list[T]:
    """Every item of every file, all checked before anything is enqueued (bad bytes: nothing)."""
    from workers.runtime.ingest import InputError

    items: list[T] = []
    for f in files:
        name, data = _read(f)
        try:
            items += parse(data, name)
        except InputError as e:
            raise BadInput(f"{e}; nothing was enqueued") from None
    return items


@cli.group("enqueue")
def enqueue_group() -> None:
    """Enqueue raw blocks or transactions (parsed first: bad bytes enqueue nothing)."""


@enqueue_group.command("block")
@click.argument("files", nargs=-1, required=True, metavar="FILE…")
@click.pass_obj
def enqueue_block(obj: Context, files: tuple[str, ...]) -> None:
    """Binary or hex blocks, or Bitcoin Core blk*.dat files (any network magic); - is stdin."""
    from workers.runtime.ingest import read_blocks, submit_block

    def one(svc: Services, blocks: list[CheckedBlock]) -> list[dict[str, Any]]:
        (block,) = blocks
        submit_block(block.raw, svc, block)
        return [{"enqueued": "block", "hash": block.hash_hex, "txs": block.n_txs}]

    def joins(svc: Services, blocks: list[CheckedBlock]) -> None:
        _check_joins(svc.utxo.snapshot_block(), blocks)

    def read(data: bytes, name: str) -> list[CheckedBlock]:  # a large file: checked on every core
        return read_blocks(data, name, processes=min(os.cpu_count() or 1, 8))

    _enqueue(obj, files, read, "blocks", "blocks", one, joins)


@enqueue_group.command("tx")
@click.argument("files", nargs=-1, required=True, metavar="FILE…")
@click.pass_obj
def enqueue_tx(obj: Context, files: tuple[str, ...]) -> None:
    """A binary transaction per file, or hex transactions one per line (standard or BIP-239).
    They go in batches, a message each (a worker applies a batch with one store call per step),
    in the order given: a parent before its children."""
    from workers.runtime.ingest import TX_BATCH, read_txs, store_txs, submit_txs

    def batch(svc: Services, txs: list[Tx]) -> list[dict[str, Any]]:
        return [{"enqueued": "tx", "txid": t} for t in submit_txs(txs, svc, stored=True)]

    _enqueue(obj, files, read_txs, "txs", "transactions", batch, size=TX_BATCH, ahead=store_txs)


def _enqueue(
    obj: Context,
    files: tuple[str, ...],
    read: Callable[[bytes, str], list[T]],
    unit: str,
    what: str,
    send: Callable[[Services, list[T]], list[dict[str, Any]]],
    check: Callable[[Services, list[T]], None] | None = None,
    size: int = 1,
    ahead: Callable[[list[T], Services], None] | None = None,
) -> None:
    """Everything read and checked first — the files, the broker URL, what the store can tell
    (`check`), the broker answering — and only then the items sent, `size` at a time, each
    item's JSON line on stdout once sent, with progress on stderr; a broker that fails
    part-way says how far the input got. `ahead` (storing the items' bytes) runs in threads,
    up to AHEAD parts before the one being sent (a store's writes wait on its disk or server),
    each part sent only once its own `ahead` is done, in order."""
    from workers.runtime.services import services

    _export(obj)
    items = _parse_all(files, read)
    obj.broker_url("; nothing was enqueued")
    svc = services()
    if check is not None:
        check(svc, items)
    _check_broker(obj)
    with Reporter() as rep, rep.step(f"enqueue {unit}", len(items), unit) as advance:
        parts = [items[k:k + size] for k in range(0, len(items), size)]
        with ThreadPoolExecutor(max_workers=AHEAD) if ahead else nullcontext() as pool:
            stored: deque[Future[None]] = deque()
            try:
                for k, part in enumerate(parts):
                    if pool is not None and ahead is not None:
                        while len(stored) < AHEAD and k + len(stored) < len(parts):
                            stored.append(pool.submit(ahead, parts[k + len(stored)], svc))
                        stored.popleft().result()  # (its StorageError: one line, exit 2, as a send's)
                    with _broker_errors(obj, k * size, len(items), what):
                        lines = send(svc, part)
                    for line in lines:
                        emit(line)
                    advance(len(part))
            except BaseException:
                if pool is not None:  # stopping: the parts not started stay unstored
                    pool.shutdown(wait=False, cancel_futures=True)
                raise


def _check_joins(snapshot: tuple[int, bytes] | None, blocks: list[CheckedBlock]) -> None:
    """On a store seeded with a UTXO snapshot: no block that can never join the chain continuing
    it (one at or below the snapshot's height) — it would wait as an orphan for ever."""
    from workers.runtime.ingest import below_snapshot_block

    found = None if snapshot is None else below_snapshot_block(blocks, snapshot)
    if found is not None:
        assert snapshot is not None
        b, h = found
        raise BadInput(
            f"{b.where}, {b.hash_hex}, is at height {h:,}: at or below the UTXO snapshot the store was "
            f"seeded with (block {hash_to_hex(snapshot[1])} at height {snapshot[0]:,}), so it can never "
            f"join the chain, which continues from there; nothing was enqueued"
        )


def _check_broker(obj: Context) -> None:
    """Before anything is registered or sent: the broker answers (a Redis that is down, or a
    database number it does not have, is refused here rather than after the first send)."""
    from workers.broker.runs import BrokerRun, BrokerUnreachable
    from workers.runtime.startup import first_line

    try:
        BrokerRun(obj.settings.broker_url).current(fresh=True)
    except BrokerUnreachable as e:
        raise BadInput(f"UTXO_BROKER_URL ({mask_url(obj.settings.broker_url)}): {first_line(e)}; "
                       "nothing was enqueued") from e


@contextmanager
def _broker_errors(obj: Context, sent: int, total: int, what: str) -> Iterator[None]:
    """A send that fails (the broker went away mid-file): say how far the input got. Each item
    is registered as pending before its send, so the one that failed is sent again by the
    workers' re-sending scan; enqueueing the same input again sends the rest (a second copy of
    what went in does no harm: every task is idempotent)."""
    from kombu.exceptions import OperationalError
    from redis import RedisError

    from workers.runtime.startup import first_line

    try:
        yield
    except (OperationalError, RedisError, ConnectionError) as e:
        raise BadInput(f"UTXO_BROKER_URL ({mask_url(obj.settings.broker_url)}) failed after {sent} "
                       f"of {total} {what} were enqueued (the lines above): {first_line(e)}; "
                       "enqueue the same input again to send the rest") from e
