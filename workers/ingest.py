"""Getting blocks and transactions in: parse the framing up front, keep the bytes in the blob
store, register the work, then enqueue a message that names it (CONTRACT `utxo enqueue`).

Invariants:
- Nothing is stored or enqueued from an input that does not parse: a file is read whole and
  checked before its first block or transaction is submitted.
- The blob is written (write-once) before the message is sent, and the message carries only the
  hash: a 1 MB block never travels through Redis. Enqueuing the same block twice is harmless.
- The message is registered as pending (in the state store) before it is sent, so a message
  the broker loses is still known, and sent again (workers/requeue.py).
"""

from __future__ import annotations

import string
import uuid
from dataclasses import dataclass

from chain import Block, ParseError, Tx, hash_to_hex, iter_blk_records, parse_tx
from stores.blob.protocol import blob_key
from workers.blockindex import keep_block, parse_block_fast
from workers.services import Services, services

BLOCK_TASK = "utxoflow.block.arrived"
TX_TASK = "utxoflow.tx.arrived"
TASKS = {"block": BLOCK_TASK, "tx": TX_TASK}  # a pending entry's kind → the task of its message
_HEX = string.hexdigits.encode() + b" \t\r\n"


def _hex_lines(data: bytes) -> list[bytes] | None:
    """The hex payloads of a text input (one per non-empty line), or None if it is not hex."""
    if not data or data.translate(None, _HEX):  # (in C: a set of a file's bytes takes seconds)
        return None
    lines = [ln.strip() for ln in data.splitlines() if ln.strip()]
    try:
        return [bytes.fromhex(ln.decode()) for ln in lines]
    except ValueError as e:
        raise ParseError(f"bad hex: {e}", 0) from None


@dataclass(frozen=True, slots=True)
class CheckedBlock:
    """A block's bytes that parse, with what enqueuing them needs: its hash and size. The parsed
    transactions are not kept: a file of many blocks is checked whole before the first is sent,
    and holding every block parsed would take many times the file's size (and its time)."""

    hash: bytes
    n_txs: int
    raw: bytes

    @property
    def hash_hex(self) -> str:
        return hash_to_hex(self.hash)


def _checked(raws: list[bytes]) -> list[CheckedBlock]:
    out = []
    for k, raw in enumerate(raws):
        try:
            block = parse_block_fast(raw)
        except ParseError as e:
            if len(raws) == 1:
                raise
            raise ParseError(f"block {k + 1} of {len(raws)}: {e.what}", e.offset) from None
        out.append(CheckedBlock(block.hash, len(block.txs), raw))
    return out


def read_blocks(data: bytes, name: str = "input") -> list[CheckedBlock]:
    """The blocks of a binary block, hex (one block per line), or a blk*.dat file of any network
    magic, each checked to parse."""
    try:
        hexed = _hex_lines(data)
        if hexed is not None:
            return _checked(hexed)
        try:
            return _checked([data])
        except ParseError as as_block:
            try:
                recs = [raw for _off, raw in iter_blk_records(data)]
            except ParseError:
                raise as_block from None  # neither: the block's own error says more
            return _checked(recs)
    except ParseError as e:
        raise ParseError(f"{name}: {e.what}", e.offset) from None


def read_txs(data: bytes, name: str = "input") -> list[Tx]:
    """Transactions from binary bytes (one transaction) or hex, one per line."""
    try:
        hexed = _hex_lines(data)
        return [parse_tx(t) for t in hexed] if hexed is not None else [parse_tx(data)]
    except ParseError as e:
        raise ParseError(f"{name}: {e.what}", e.offset) from None


def publish(task: str, arg: str, ident: str) -> None:
    """Send the message of `ident`: the task naming `arg` (also what workers/requeue.py sends
    again; each send gets a task id of its own)."""
    from workers.app import app

    app.send_task(task, args=[arg, ident], task_id=f"{ident}:{uuid.uuid4().hex[:12]}")


def send(task: str, arg: str, ident: str, svc: Services) -> None:
    """Register `ident` as pending, then send the task naming `arg`."""
    svc.registry.add(ident)
    publish(task, arg, ident)


def submit_block(raw: bytes, svc: Services | None = None, block: Block | CheckedBlock | None = None) -> str:
    """Store and enqueue one block (ParseError when the bytes are not one; `block`: they were
    parsed or checked already, into it); its hash."""
    svc = svc or services()
    block = block or parse_block_fast(raw)
    keep_block(svc.blobs, block.hash, raw, block if isinstance(block, Block) else None)
    send(BLOCK_TASK, block.hash_hex, f"block:{block.hash_hex}", svc)
    return block.hash_hex


def submit_tx(raw: bytes | Tx, svc: Services | None = None) -> str:
    """Store (extended if it is) and enqueue one transaction; returns its txid (display hex)."""
    svc = svc or services()
    tx = parse_tx(raw) if isinstance(raw, bytes) else raw
    data = tx.serialize(extended=True) if tx.is_extended else tx.raw
    svc.blobs.put_if_absent(blob_key(tx.txid, "tx"), data)
    send(TX_TASK, tx.txid_hex, f"tx:{tx.txid_hex}", svc)
    return tx.txid_hex
