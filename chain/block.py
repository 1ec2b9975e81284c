"""Blocks: header, transactions, merkle root, proof of work, BIP34 height, blk*.dat framing.

Invariants:
- A block parses only if its bytes are exactly header ‖ VarInt(n) ‖ n transactions: no trailing
  bytes, no SegWit serialization, and a transaction count bounded by the bytes that remain.
- `merkle_root` reports the CVE-2012-2459 mutation (a duplicated last pair) beside the root, so
  a block whose root only matches thanks to a repeated transaction is caught by the caller.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from chain.errors import ParseError
from chain.hashes import hash_to_hex, sha256d
from chain.tx import Tx, read_tx

HEADER_SIZE = 80
_MIN_TX = 60  # version, 1 input of 41 bytes, 1 output of 9 bytes, locktime: a safe lower bound
_header = struct.Struct("<I32s32sIII")


@dataclass(slots=True)
class BlockHeader:
    version: int
    prev_hash: bytes  # internal byte order
    merkle_root: bytes
    timestamp: int
    bits: int
    nonce: int
    hash: bytes  # internal byte order

    @property
    def hash_hex(self) -> str:
        return hash_to_hex(self.hash)

    @property
    def prev_hash_hex(self) -> str:
        return hash_to_hex(self.prev_hash)


@dataclass(slots=True)
class Block:
    header: BlockHeader
    txs: list[Tx]
    size: int

    @property
    def hash(self) -> bytes:
        return self.header.hash

    @property
    def hash_hex(self) -> str:
        return self.header.hash_hex

    def computed_merkle_root(self) -> tuple[bytes, bool]:
        return merkle_root([t.txid for t in self.txs])


def parse_header(data: bytes, offset: int = 0) -> BlockHeader:
    if len(data) - offset < HEADER_SIZE:
        raise ParseError(f"truncated block header: {len(data) - offset} of 80 bytes", offset)
    raw = bytes(data[offset : offset + HEADER_SIZE])
    version, prev, root, ts, bits, nonce = _header.unpack(raw)
    return BlockHeader(version, prev, root, ts, bits, nonce, sha256d(raw))


def parse_block(data: bytes) -> Block:
    """Parse a whole block. Every transaction must be BSV (standard serialization)."""
    buf = bytes(data)
    header = parse_header(buf)
    pos = HEADER_SIZE
    if pos >= len(buf):
        raise ParseError("truncated block: transaction count missing", pos)
    n = buf[pos]
    pos += 1
    if n >= 0xFD:
        size = {0xFD: 2, 0xFE: 4, 0xFF: 8}[n]
        if pos + size > len(buf):
            raise ParseError("truncated block: transaction count cut short", pos - 1)
        n = int.from_bytes(buf[pos : pos + size], "little")
        pos += size
    if n == 0:
        raise ParseError("block has no transactions", pos - 1)
    if n * _MIN_TX > len(buf) - pos:
        raise ParseError(f"transaction count {n} exceeds the {len(buf) - pos} bytes that remain", pos)
    txs: list[Tx] = []
    append = txs.append
    for i in range(n):
        start = pos
        try:
            tx, pos = read_tx(buf, pos)
        except ParseError as e:
            raise ParseError(f"transaction {i} of {n}: {e.what}", e.offset) from None
        if pos - start != len(tx.raw):
            # Only extended format makes the bytes read differ from the standard bytes.
            raise ParseError(f"transaction {i} of {n} is in extended format inside a block", start)
        append(tx)
    if pos != len(buf):
        raise ParseError(f"{len(buf) - pos} trailing bytes after the last transaction", pos)
    return Block(header, txs, len(buf))


def merkle_root(txids: list[bytes]) -> tuple[bytes, bool]:
    """The merkle root of internal-order txids, and whether the tree is CVE-2012-2459 mutated."""
    if not txids:
        raise ValueError("merkle root of no transactions")
    level = list(txids)
    mutated = False
    while len(level) > 1:
        for i in range(0, len(level) - 1, 2):
            if level[i] == level[i + 1]:
                mutated = True
        if len(level) & 1:
            level.append(level[-1])
        level = [sha256d(level[i] + level[i + 1]) for i in range(0, len(level), 2)]
    return level[0], mutated


def bits_to_target(bits: int) -> int:
    """The target a compact `bits` encodes; raises ValueError for a negative or overflowing one."""
    exponent = bits >> 24
    mantissa = bits & 0x007FFFFF
    if bits & 0x00800000 and mantissa:
        raise ValueError(f"bits {bits:#010x} encode a negative target")
    if exponent <= 3:
        target = mantissa >> (8 * (3 - exponent))
    else:
        target = mantissa << (8 * (exponent - 3))
    if target >= 1 << 256:
        raise ValueError(f"bits {bits:#010x} encode a target above 2^256")
    return target


def check_pow(header: BlockHeader) -> bool:
    """True when the header's hash meets the target its own `bits` state."""
    try:
        target = bits_to_target(header.bits)
    except ValueError:
        return False
    return target > 0 and int.from_bytes(header.hash, "little") <= target


def block_work(bits: int) -> int:
    """Expected hashes for a block at this difficulty: 2^256 / (target + 1), as Bitcoin Core."""
    target = bits_to_target(bits)
    if target <= 0:
        return 0
    return (1 << 256) // (target + 1)


def bip34_height(block: Block) -> int | None:
    """The height a version ≥ 2 block states in its coinbase script (BIP34), else None."""
    if block.header.version < 2 or not block.txs or not block.txs[0].is_coinbase:
        return None
    script = block.txs[0].inputs[0].script_sig
    if not script:
        return None
    op = script[0]
    if op == 0x00:
        return 0
    if 0x51 <= op <= 0x60:
        return op - 0x50
    if 1 <= op <= 8 and len(script) >= 1 + op:
        return int.from_bytes(script[1 : 1 + op], "little", signed=False)
    return None


def iter_blk_records(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Blocks of a Bitcoin Core blk*.dat file: (offset, block bytes). Any network magic.

    Each record is magic (4 bytes) ‖ little-endian length (4 bytes) ‖ block. Core pre-allocates
    these files, so a run of zero bytes ends the file rather than being an error.
    """
    pos = 0
    n = len(data)
    magic: bytes | None = None
    while pos < n:
        if data[pos : pos + 4] in (b"", b"\x00\x00\x00\x00") and not any(data[pos : pos + 64]):
            return
        if pos + 8 > n:
            raise ParseError("truncated blk record header", pos)
        rec_magic = bytes(data[pos : pos + 4])
        if magic is None:
            magic = rec_magic
        elif rec_magic != magic:
            raise ParseError(f"blk record magic {rec_magic.hex()} differs from {magic.hex()}", pos)
        length = int.from_bytes(data[pos + 4 : pos + 8], "little")
        if length < HEADER_SIZE + 1 or pos + 8 + length > n:
            raise ParseError(f"blk record of {length} bytes runs past the end of the file", pos)
        yield pos + 8, bytes(data[pos + 8 : pos + 8 + length])
        pos += 8 + length
