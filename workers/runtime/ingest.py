"""Getting blocks and transactions in: parse the framing up front, keep the bytes in the blob
store, register the work, then enqueue a message that names it (CONTRACT `utxo enqueue`).

Invariants:
- Nothing is stored or enqueued from an input that does not parse, or holds a block invalid on
  its own (`chain.check_block`): a file is read whole and checked before its first block or
  transaction is submitted. A refusal (InputError) names the input and the place in it in words:
  line and column of hex text, record of a blk*.dat file, block number and hash.
- The blob is written (write-once) before the message is sent, and the message carries only the
  hash: a 1 MB block never travels through Redis. Enqueuing the same block twice is harmless. A
  small transaction's bytes are kept with its registration instead (workers/runtime/txsource.py).
- The message is registered as pending (in the state store) before it is sent, so a message
  the broker loses is still known, and sent again (workers/recovery/requeue.py).
- A block checked at the door is put into the block index before its message is sent
  (`BlockIndex.accept_checked`, from its header: nothing parsed again), so that the chain's
  holder finds every block of a file ready when the first message is taken, and applies them
  in batches; a block task finding its block indexed goes straight to the chain. Indexing is
  only a head start: a block the index could not take then (its lease held for long) is
  indexed by its task, as any block sent without the door's checks is.
"""

from __future__ import annotations

import logging
import re
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from chain import (
    BLK_MAGICS,
    Block,
    ParseError,
    Tx,
    check_block,
    hash_to_hex,
    hex_to_hash,
    iter_blk_records,
    parse_tx,
)
from stores.errors import StorageError
from stores.state import StateStore
from workers.chainstate.blockindex import below_snapshot, keep_block, parse_block_fast, stated_height
from workers.runtime.procmap import map_ranges
from workers.runtime.services import Services, services
from workers.runtime.txsource import split

log = logging.getLogger("utxoflow.ingest")
BLOCK_TASK = "utxoflow.block.arrived"
TX_TASK = "utxoflow.tx.arrived"
TXS_TASK = "utxoflow.txs.arrived"  # a batch of transactions, each its own message id
TX_BATCH = 250  # transactions per message `utxo enqueue tx` sends
TASKS = {"block": BLOCK_TASK, "tx": TX_TASK}  # a pending entry's kind → the task of its message
_SPACE = b" \t\r\n"
_HEX = string.hexdigits.encode() + _SPACE
_NOT_HEX = re.compile(rb"[^0-9A-Fa-f \t\r\n]")
# A text input is hex with at most this share of other bytes (typos); binary blocks are mostly
# other bytes (a byte is a hex digit or white space 26 times in 256).
TYPO_SHARE = 0.1
# Checking blocks in several processes (`utxo enqueue`) pays from this much input: a fork and a
# child's answer cost a few milliseconds; a process checks about 30 MB of blocks a second.
PARALLEL_FROM_BYTES = 4 << 20
T = TypeVar("T")


class InputError(ValueError):
    """An input that is not blocks or transactions `utxo enqueue` reads (or blocks that cannot be
    applied): the message names the input and the place in it, in words (line and column, record,
    block and hash)."""


def _not_empty(data: bytes, name: str) -> None:
    if not data.strip():
        raise InputError(f"{name} is empty" + (" (only white space)" if data else ""))


def _hex_lines(data: bytes, name: str) -> list[tuple[int, bytes]] | None:
    """The hex payloads of a text input with their line numbers (one per non-empty line), or
    None if it holds anything but hex digits and white space."""
    if data.translate(None, _HEX):  # (in C: a set of a file's bytes takes seconds)
        return None
    out = []
    for line_no, line in enumerate(data.splitlines(), 1):
        digits = line.translate(None, _SPACE)
        if not digits:
            continue
        if len(digits) % 2:
            raise InputError(f"{name}: line {line_no} has an odd number of hex digits ({len(digits):,}): "
                             "one is missing or one too many")
        out.append((line_no, bytes.fromhex(digits.decode())))
    return out


def _typo(data: bytes, name: str) -> None:
    """An input that does not parse as binary but is mostly hex text: a hex text with a typo,
    refused naming the line and column of its first byte that is no hex digit."""
    bad = _NOT_HEX.search(data)
    if bad is None or len(data.translate(None, _HEX)) > TYPO_SHARE * len(data):
        return
    pos = bad.start()
    start = max(data.rfind(b"\n", 0, pos), data.rfind(b"\r", 0, pos)) + 1
    line_no = len(data[:start].splitlines()) + 1
    b = data[pos]
    shown = repr(chr(b)) if 0x20 <= b < 0x7F else f"byte 0x{b:02x}"
    raise InputError(f"{name}: line {line_no}, column {pos - start + 1}: {shown} is not a hex digit "
                     "(a text input is read as hex, one item per line)")


def _read(
    data: bytes, name: str, binary: Callable[[], list[T]], lines: Callable[[list[tuple[int, bytes]]], list[T]]
) -> list[T]:
    """Hex text, else binary: an empty input, or hex text with a typo, said as such."""
    _not_empty(data, name)
    hexed = _hex_lines(data, name)
    if hexed is not None:
        return lines(hexed)
    try:
        return binary()
    except InputError:
        _typo(data, name)
        raise


@dataclass(frozen=True, slots=True)
class CheckedBlock:
    """A block's bytes that parse, and whose transactions match its header (`chain.check_block`),
    with what enqueuing them needs: its hash and size, its parent and the height it states, and
    where it was read (for messages). The parsed transactions are not kept: a file of many blocks
    is checked whole before the first is sent, and holding every block parsed would take many
    times the file's size (and its time)."""

    hash: bytes
    n_txs: int
    raw: bytes
    prev: bytes
    height: int | None  # workers.chainstate.blockindex.stated_height
    where: str  # "NAME: block K of N (line L)"
    bits: int  # its header's target

    @property
    def hash_hex(self) -> str:
        return hash_to_hex(self.hash)


def _checked(raws: list[tuple[str, int, bytes]], name: str, processes: int = 1) -> list[CheckedBlock]:
    """Each block of (place in the input, offset of its bytes in the file or -1, bytes), parsed and
    checked on its own (InputError naming the first that is not a valid block); in up to
    `processes` processes when the blocks are many and large enough to pay for them."""
    n = len(raws)

    def where(k: int) -> str:
        place = raws[k][0]
        return f"{name}: block {k + 1} of {n}" + (f" ({place})" if place else "")

    def check(lo: int, hi: int) -> list[list[Any]]:
        """["ok", hash, prev, txs, height, bits] per block of lo … hi-1 (hex hashes), up to the
        first that is not valid: ["error", what is wrong], and no further."""
        out: list[list[Any]] = []
        for k in range(lo, hi):
            _place, at, raw = raws[k]
            try:
                block = parse_block_fast(raw)
            except ParseError as e:
                of = f"{at + e.offset:,} of the file" if at >= 0 else f"{e.offset:,} of the block"
                return [*out, ["error", f"{where(k)}: {e.what} (at byte offset {of})"]]
            reason = check_block(block)
            if reason is not None:
                return [*out, ["error", f"{where(k)}, {block.hash_hex}: {reason}"]]
            prev, height = block.header.prev_hash.hex(), stated_height(block)
            out.append(["ok", block.hash.hex(), prev, len(block.txs), height, block.header.bits])
        return out

    big = processes > 1 and n > 1 and sum(len(r) for _p, _a, r in raws) >= PARALLEL_FROM_BYTES
    found = map_ranges(n, processes, check) if big else check(0, n)
    blocks = []
    for k, got in enumerate(found):
        if got[0] == "error":
            raise InputError(got[1])
        _ok, h, prev, txs, height, bits = got
        raw = raws[k][2]
        blocks.append(CheckedBlock(bytes.fromhex(h), txs, raw, bytes.fromhex(prev), height, where(k), bits))
    return blocks


def _binary_blocks(data: bytes, name: str, processes: int = 1) -> list[CheckedBlock]:
    """One binary block, else a blk*.dat file (a cut blk file named by its cut record)."""
    try:
        return _checked([("", 0, data)], name)
    except InputError as as_block:
        try:
            recs = list(iter_blk_records(data))
        except ParseError as e:
            if e.offset > 0 or data[:4] in BLK_MAGICS:  # a blk file: a record came first, or its magic
                raise InputError(f"{name}: {e}") from None
            raise as_block from None  # neither: the block's own error says more
        places = [(f"blk record at byte offset {off - 8:,}", off, raw) for off, raw in recs]
        return _checked(places, name, processes)


def read_blocks(data: bytes, name: str = "input", processes: int = 1) -> list[CheckedBlock]:
    """The blocks of a binary block, hex (one block per line), or a blk*.dat file of any network
    magic, each checked to parse and to be valid on its own (InputError says where not); a large
    input in up to `processes` processes (`workers.runtime.procmap`: the same answer, sooner)."""
    return _read(data, name, lambda: _binary_blocks(data, name, processes),
                 lambda lines: _checked([(f"line {ln}", -1, raw) for ln, raw in lines], name, processes))


def below_snapshot_block(
    blocks: list[CheckedBlock], snapshot: tuple[int, bytes]
) -> tuple[CheckedBlock, int] | None:
    """The first of `blocks` that cannot join the chain continuing a UTXO snapshot taken at
    `snapshot` (height, hash), with its height: a block's height is the one it states, else
    its parent's (among `blocks`, or the snapshot's block) plus one."""
    by_hash = {b.hash: b for b in blocks}
    heights: dict[bytes, int | None] = {snapshot[1]: snapshot[0]}

    def height(b: CheckedBlock) -> int | None:
        path: list[bytes] = []  # blocks whose height follows their parent's, child first
        h, on_path = b.hash, set()
        while h not in heights:
            x = by_hash.get(h)
            if x is None or h in on_path:  # a parent outside the input: no height follows
                break
            if x.height is not None:
                heights[h] = x.height
                break
            path.append(h)
            on_path.add(h)
            h = x.prev
        known = heights.get(h)
        for y in reversed(path):
            known = None if known is None else known + 1
            heights[y] = known
        return known

    for b in blocks:
        h = height(b)
        if below_snapshot(h, b.hash, snapshot):
            assert h is not None
            return b, h
    return None


def read_txs(data: bytes, name: str = "input") -> list[Tx]:
    """Transactions from binary bytes (one transaction) or hex, one per line (InputError says
    where not)."""

    def binary() -> list[Tx]:
        try:
            return [parse_tx(data)]
        except ParseError as e:
            raise InputError(f"{name}: {e}") from None

    def lines(hexed: list[tuple[int, bytes]]) -> list[Tx]:
        out = []
        for k, (line_no, raw) in enumerate(hexed):
            try:
                out.append(parse_tx(raw))
            except ParseError as e:
                raise InputError(f"{name}: tx {k + 1} of {len(hexed)} (line {line_no}): {e.what} "
                                 f"(at byte offset {e.offset:,} of the tx)") from None
        return out

    return _read(data, name, binary, lines)


def publish(task: str, arg: str, ident: str, height: int | None = None) -> None:
    """Send the message of `ident`: the task naming `arg` (also what workers/recovery/requeue.py sends
    again; each send gets a task id of its own). For Flower's task list the id is short and
    says what the task is about (`block-812345-…`, `tx-…`: a list's columns stay on the screen),
    and the arguments shown are the block's height, when known, and hash (or the txid)."""
    from workers.runtime.app import app

    kind = ident.partition(":")[0]
    where = f"{height}-" if height is not None else ""
    shown = f"[{height}, {arg!r}]" if height is not None else f"[{arg!r}]"
    app.send_task(task, args=[arg, ident], task_id=f"{kind}-{where}{uuid.uuid4().hex[:12]}", argsrepr=shown)


def publish_known(state: StateStore, task: str, arg: str, ident: str) -> None:
    """`publish`, a block's height looked up in the index (a message sent again, or one that
    takes up the chain: the index knows the block)."""
    height = None
    if task == BLOCK_TASK:
        entry = state.get_block(hex_to_hash(arg))
        height = None if entry is None else entry.height
    publish(task, arg, ident, height)


def send(task: str, arg: str, ident: str, svc: Services, height: int | None = None) -> None:
    """Register `ident` as pending, then send the task naming `arg`."""
    svc.registry.add(ident)
    publish(task, arg, ident, height)


def submit_block(
    raw: bytes, svc: Services | None = None, block: Block | CheckedBlock | None = None,
    index: bool | None = None,
) -> str:
    """Store and enqueue one block (ParseError when the bytes are not one; `block`: they were
    parsed or checked already, into it); its hash. `index` (by default: for a block checked at
    the door, a CheckedBlock) puts it into the block index before its message is sent (see the
    invariants); otherwise its task indexes it."""
    svc = svc or services()
    block = block or parse_block_fast(raw)
    keep_block(svc.blobs, block.hash, raw, block if isinstance(block, Block) else None)
    checked = isinstance(block, CheckedBlock)
    height = block.height if isinstance(block, CheckedBlock) else stated_height(block)
    if checked if index is None else index:
        _index(svc, block)
    send(BLOCK_TASK, block.hash_hex, f"block:{block.hash_hex}", svc, height)
    return block.hash_hex


def _index(svc: Services, block: Block | CheckedBlock) -> None:
    """The block into the index ahead of its task (a head start only: a state store that fails
    here fails the registry's write next, and an index lease held for long leaves it to the
    task)."""
    index = svc.sequencer.index
    try:
        if isinstance(block, CheckedBlock):
            index.accept_checked(block.hash, block.prev, block.bits, block.n_txs, block.height)
        else:
            index.accept(block)
    except StorageError as e:
        log.warning("block %s: not indexed ahead of its task (%s)", block.hash_hex, e)


def submit_txs(txs: Sequence[Tx], svc: Services | None = None, stored: bool = False) -> list[str]:
    """Store and enqueue `txs` as one message (`utxoflow.txs.arrived`), each registered under
    its own id first, in one write that keeps the bytes of the small ones
    (workers/runtime/txsource.py); their txids (display hex), in their order, which is the
    order the worker applies them in (a parent listed after its child: the child waits for
    it). `stored`: `store_txs` has written the large ones' bytes already."""
    svc = svc or services()
    kept, blobs = split(txs)
    if blobs and not stored:
        svc.blobs.put_many_if_absent(blobs)
    txids = [tx.txid_hex for tx in txs]
    idents = [f"tx:{t}" for t in txids]
    svc.registry.add_many(idents, kept)
    publish_txs(txids, idents)
    return txids


def store_txs(txs: Sequence[Tx], svc: Services) -> None:
    """The bytes of those of `txs` too large to travel with their registration, in the blob
    store, durable (before any message names them). Safe in a thread beside the one that
    registers and sends: `utxo enqueue tx` stores batches ahead."""
    _kept, blobs = split(txs)
    if blobs:
        svc.blobs.put_many_if_absent(blobs)


def publish_txs(txids: list[str], idents: list[str]) -> None:
    """Send one message for transactions registered under `idents` (`utxoflow.txs.arrived`;
    also what workers/recovery/requeue.py sends again). Flower shows how many and the first."""
    from workers.runtime.app import app

    app.send_task(TXS_TASK, args=[txids, idents], task_id=f"txs-{len(txids)}-{uuid.uuid4().hex[:12]}",
                  argsrepr=f"[{len(txids)} txs: {txids[0]!r}…]")


def submit_tx(raw: bytes | Tx, svc: Services | None = None) -> str:
    """Store (extended if it is) and enqueue one transaction; returns its txid (display hex)."""
    svc = svc or services()
    tx = parse_tx(raw) if isinstance(raw, bytes) else raw
    kept, blobs = split([tx])
    if blobs:
        svc.blobs.put_many_if_absent(blobs)
    ident = f"tx:{tx.txid_hex}"
    svc.registry.add_many([ident], kept)
    publish(TX_TASK, tx.txid_hex, ident)
    return tx.txid_hex
