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
from chain.tx import Tx, _varint_at, read_txs

HEADER_SIZE = 80
# The smallest transaction `read_tx` accepts: version, one input of 41 bytes, an output count of
# zero, locktime (a transaction without outputs parses; refusing it is the store's business).
_MIN_TX = 4 + 1 + 41 + 1 + 4
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
    n, pos = _varint_at(buf, pos, "transaction count")
    if n == 0:
        raise ParseError("block has no transactions", HEADER_SIZE)
    if n * _MIN_TX > len(buf) - pos:
        raise ParseError(f"transaction count {n} exceeds the {len(buf) - pos} bytes that remain", pos)
    txs, pos = read_txs(buf, pos, n, in_block=True)
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
    """The target a compact `bits` encodes; raises ValueError for a negative or overflowing one.

    As Bitcoin Core's SetCompact: the sign bit makes a target negative only when the mantissa
    left after the exponent's shift is non-zero (0x01803456 is zero, not negative).
    """
    if not 0 <= bits <= 0xFFFFFFFF:
        raise ValueError(f"bits {bits} is not a 32-bit unsigned value")
    exponent = bits >> 24
    mantissa = bits & 0x007FFFFF
    if exponent <= 3:
        target = mantissa >> (8 * (3 - exponent))
    else:
        target = mantissa << (8 * (exponent - 3))
    if target and bits & 0x00800000:
        raise ValueError(f"bits {bits:#010x} encode a negative target")
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


BODY_MISMATCH = ("merkle root does not match", "merkle root mutation")  # reasons of a corrupted copy


def check_block(block: Block) -> str | None:
    """Why a block is invalid on its own, before any transaction is applied (None: it is not):
    proof of work, no transactions, a merkle root that does not match (or matches only thanks to
    a duplicated last pair), a repeated txid, a first transaction that is not a coinbase, a
    second coinbase. A reason that starts with one of BODY_MISMATCH means the transactions do
    not match the header: another copy with the same hash may be the genuine block."""
    if not check_pow(block.header):
        return "proof of work does not meet its bits"
    if not block.txs:
        return "no transactions"
    root, mutated = block.computed_merkle_root()
    if root != block.header.merkle_root:
        return "merkle root does not match its transactions"
    if mutated:
        return "merkle root mutation: a duplicated last pair of transactions (CVE-2012-2459)"
    seen: set[bytes] = set()
    for t in block.txs:
        if t.txid in seen:
            return f"repeats tx {t.txid_hex}"
        seen.add(t.txid)
    if not block.txs[0].is_coinbase:
        return "its first transaction is not a coinbase"
    extra = next((t for t in block.txs[1:] if t.is_coinbase), None)
    if extra is not None:
        return f"tx {extra.txid_hex} is a second coinbase"
    return None


# Network magics of blk*.dat files (Bitcoin and BSV: main, test, regtest, STN; signet). Files of
# any magic parse; these only tell a blk file cut inside its first record from a broken raw block.
BLK_MAGICS = frozenset(
    bytes.fromhex(m)
    for m in ("f9beb4d9", "0b110907", "fabfb5da", "0a03cf40", "e3e1f3e8", "f4e5f3f4", "dab5bffa", "fbcec4f9")
)


def iter_blk_records(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Blocks of a Bitcoin Core blk*.dat file: (offset, block bytes). Any network magic.

    Each record is magic (4 bytes) ‖ little-endian length (4 bytes) ‖ block. Core pre-allocates
    these files, so zero bytes running to the end of the file end it rather than being an error;
    zeros followed by anything else are an error, never silently skipped. An error names the
    record (counted from 1) and sits at the record's offset.
    """
    buf = bytes(data)
    pos = 0
    n = len(buf)
    magic: bytes | None = None
    k = 0
    while pos < n:
        if not any(buf[pos : pos + 8]) and buf.count(0, pos) == n - pos:
            return
        k += 1
        if pos + 8 > n:
            raise ParseError(f"truncated blk record header: record {k} has {n - pos} of its 8 bytes", pos)
        rec_magic = buf[pos : pos + 4]
        if magic is None:
            magic = rec_magic
        elif rec_magic != magic:
            raise ParseError(f"blk record {k}: magic {rec_magic.hex()} differs from {magic.hex()}", pos)
        length = int.from_bytes(buf[pos + 4 : pos + 8], "little")
        if length < HEADER_SIZE + 1:
            raise ParseError(f"blk record {k} of {length} bytes is too short to hold a block", pos)
        if pos + 8 + length > n:
            raise ParseError(
                f"blk record {k} is cut: it claims {length:,} bytes and {n - pos - 8:,} remain "
                "(it runs past the end of the file)",
                pos,
            )
        yield pos + 8, buf[pos + 8 : pos + 8 + length]
        pos += 8 + length
