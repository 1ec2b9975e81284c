"""Merkle roots (with the CVE-2012-2459 mutation), compact targets, block work, proof of work."""

from __future__ import annotations

import struct

import pytest

from chain import (
    Block,
    BlockHeader,
    ParseError,
    bits_to_target,
    block_work,
    check_pow,
    merkle_root,
    parse_block,
    parse_header,
    sha256d,
)
from chain.tx import varint

GENESIS_BITS = 0x1D00FFFF


def header_bytes(h: BlockHeader) -> bytes:
    return struct.pack("<I32s32sIII", h.version, h.prev_hash, h.merkle_root, h.timestamp, h.bits, h.nonce)


def test_cve_2012_2459_duplicate_last_tx_same_root_flagged(block_413567: Block) -> None:
    txids = [t.txid for t in block_413567.txs]
    assert len(txids) % 2 == 1
    root, mutated = merkle_root(txids)
    assert root == block_413567.header.merkle_root and not mutated
    root2, mutated2 = merkle_root([*txids, txids[-1]])
    assert root2 == root
    assert mutated2


def test_cve_2012_2459_on_a_whole_block(block_277647_bytes: bytes, block_277647: Block) -> None:
    """The block with its last tx repeated parses, matches the header's root, and is flagged."""
    n = len(block_277647.txs)
    assert n % 2 == 1 and block_277647_bytes[80] == n
    mutated_bytes = (
        block_277647_bytes[:80] + varint(n + 1) + block_277647_bytes[81:] + block_277647.txs[-1].raw
    )
    mutated = parse_block(mutated_bytes)
    assert mutated.hash == block_277647.hash  # same header
    root, flagged = mutated.computed_merkle_root()
    assert root == block_277647.header.merkle_root
    assert flagged


def test_mutation_deeper_in_the_tree_is_flagged() -> None:
    leaves = [sha256d(bytes([i])) for i in range(6)]
    root, mutated = merkle_root(leaves)
    assert not mutated
    # Six leaves pad to [.., e, f, e, f] one level up: repeating the last pair gives the same root.
    root2, mutated2 = merkle_root([*leaves, leaves[4], leaves[5]])
    assert root2 == root and mutated2


def test_merkle_edge_cases() -> None:
    one = sha256d(b"x")
    assert merkle_root([one]) == (one, False)
    two = sha256d(b"y")
    assert merkle_root([one, two]) == (sha256d(one + two), False)
    assert merkle_root([one, one]) == (sha256d(one + one), True)
    assert merkle_root([one, two, two]) == (sha256d(sha256d(one + two) + sha256d(two + two)), False)
    with pytest.raises(ValueError):
        merkle_root([])


def test_a_flipped_byte_changes_the_root(block_413567_bytes: bytes, block_413567: Block) -> None:
    data = bytearray(block_413567_bytes)
    data[-1] ^= 0x01  # the last tx's locktime: still parses
    block = parse_block(bytes(data))
    assert block.txs[-1].txid != block_413567.txs[-1].txid
    root, mutated = block.computed_merkle_root()
    assert root != block.header.merkle_root and not mutated
    # A flip inside a script (the coinbase's first output value) does too.
    data = bytearray(block_413567_bytes)
    cb_at = 83
    out_at = cb_at + len(block_413567.txs[0].raw) - 4 - 8 - 1 - len(block_413567.txs[0].outputs[-1].script)
    data[out_at] ^= 0x80
    block = parse_block(bytes(data))
    assert block.txs[0].outputs[-1].satoshis != block_413567.txs[0].outputs[-1].satoshis
    assert block.computed_merkle_root()[0] != block.header.merkle_root


def test_genesis_bits_target_and_work() -> None:
    assert bits_to_target(GENESIS_BITS) == 0xFFFF << 208
    assert block_work(GENESIS_BITS) == 0x100010001


@pytest.mark.parametrize(
    ("bits", "target"),
    [
        # Bitcoin Core's SetCompact vectors (arith_uint256_tests).
        (0x00000000, 0),
        (0x00123456, 0),
        (0x01003456, 0),
        (0x02000056, 0),
        (0x03000000, 0),
        (0x04000000, 0),
        (0x00923456, 0),
        (0x01803456, 0),  # sign bit, but the mantissa left after the shift is zero: not negative
        (0x02800056, 0),
        (0x03800000, 0),
        (0x04800000, 0),
        (0x01123456, 0x12),
        (0x02123456, 0x1234),
        (0x03123456, 0x123456),
        (0x04123456, 0x12345600),
        (0x05009234, 0x92340000),
        (0x20123456, 0x123456 << (8 * 29)),
        (0x22000001, 1 << 248),
        (0x18058436, 0x058436 << (8 * 21)),
    ],
    ids=lambda v: f"{v:#010x}" if v < 1 << 32 else "",
)
def test_bits_to_target_vectors(bits: int, target: int) -> None:
    assert bits_to_target(bits) == target


@pytest.mark.parametrize("bits", [0x01FEDCBA, 0x04923456, 0x1D80FFFF, 0x03800001], ids=hex)
def test_negative_bits_are_rejected(bits: int) -> None:
    with pytest.raises(ValueError, match="negative"):
        bits_to_target(bits)
    with pytest.raises(ValueError):
        block_work(bits)


@pytest.mark.parametrize("bits", [0xFF123456, 0x23000001, 0x22000100, 0x21010000], ids=hex)
def test_overflowing_bits_are_rejected(bits: int) -> None:
    with pytest.raises(ValueError, match="2\\^256"):
        bits_to_target(bits)
    with pytest.raises(ValueError):
        block_work(bits)


@pytest.mark.parametrize("bits", [-1, 1 << 32, (1 << 64) | 0x1D00FFFF])
def test_bits_outside_32_bits_are_rejected(bits: int) -> None:
    with pytest.raises(ValueError, match="32-bit"):
        bits_to_target(bits)


def test_block_work_edges() -> None:
    assert block_work(0x01003456) == 0  # zero target: no work, no division by zero
    assert block_work(0x207FFFFF) == 2  # regtest: target just under 2^255
    assert block_work(0x18058436) > block_work(GENESIS_BITS) * 10**11


def test_check_pow_fails_after_changing_the_nonce(block_413567_bytes: bytes, block_413567: Block) -> None:
    header = block_413567.header
    assert check_pow(header)
    raw = bytearray(block_413567_bytes[:80])
    assert struct.unpack_from("<I", raw, 76)[0] == header.nonce
    struct.pack_into("<I", raw, 76, (header.nonce + 1) & 0xFFFFFFFF)
    changed = parse_header(bytes(raw))
    assert changed.nonce == header.nonce + 1 and changed.hash != header.hash
    assert not check_pow(changed)


def test_check_pow_on_bad_bits(blocks_1_255: list[Block], block_413567_bytes: bytes) -> None:
    raw = bytearray(block_413567_bytes[:80])
    struct.pack_into("<I", raw, 72, 0x04923456)  # negative target
    assert not check_pow(parse_header(bytes(raw)))
    struct.pack_into("<I", raw, 72, 0x01003456)  # zero target
    assert not check_pow(parse_header(bytes(raw)))
    # A difficulty-1 header meets the easiest target but not one a billion times harder.
    h = blocks_1_255[0].header
    assert check_pow(h)
    raw = bytearray(header_bytes(h))
    struct.pack_into("<I", raw, 72, 0x1A00FFFF)
    assert not check_pow(parse_header(bytes(raw)))


def test_parse_header_checks_length_and_offset(block_413567_bytes: bytes, block_413567: Block) -> None:
    h = parse_header(b"\x00" * 5 + block_413567_bytes[:80], 5)
    assert h == block_413567.header
    assert header_bytes(h) == block_413567_bytes[:80]
    assert sha256d(header_bytes(h)) == h.hash
    with pytest.raises(ParseError, match="79 of 80") as e:
        parse_header(block_413567_bytes[:79])
    assert e.value.offset == 0
