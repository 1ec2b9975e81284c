"""Every real block in the data directory parses, and its merkle root, proof of work, hashes,
heights and counts are those of mainnet."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from chain import (
    Block,
    ParseError,
    bip34_height,
    block_work,
    check_pow,
    hash_to_hex,
    iter_blk_records,
    merkle_root,
    parse_block,
    sha256d,
)
from tests.chain.conftest import MAINNET_GENESIS

BLOCK_413567_HASH = "0000000000000000025aff8be8a55df8f89c77296db6198f272d6577325d4069"
BLOCK_1_HASH = "00000000839a8e6886ab5951d76f411475428afc90947ee320161bbf18eb6048"


def assert_sound(block: Block) -> None:
    """Merkle root as the header says, not mutated, proof of work met, txids unique."""
    root, mutated = block.computed_merkle_root()
    assert root == block.header.merkle_root
    assert not mutated
    assert check_pow(block.header)
    assert block.txs[0].is_coinbase
    assert not any(t.is_coinbase for t in block.txs[1:])
    assert len({t.txid for t in block.txs}) == len(block.txs)
    assert sum(t.size for t in block.txs) < block.size


@pytest.mark.parametrize("name", ["mainnet-413567.block", "mainnet-277647.block"])
def test_single_blocks_parse_and_check_out(data_dir: Path, name: str) -> None:
    data = (data_dir / name).read_bytes()
    block = parse_block(data)
    assert_sound(block)
    assert block.size == len(data)
    # Every tx's raw bytes are exactly its slice of the block, and txid is sha256d(raw).
    assert b"".join(t.raw for t in block.txs) == data[len(data) - sum(t.size for t in block.txs) :]
    for t in block.txs[:50]:
        assert t.txid == sha256d(t.raw)


def test_block_413567_hash_height_and_counts(block_413567: Block) -> None:
    b = block_413567
    assert b.hash_hex == BLOCK_413567_HASH
    assert b.header.hash_hex == BLOCK_413567_HASH
    assert hash_to_hex(b.hash) == BLOCK_413567_HASH
    assert bip34_height(b) == 413567
    assert b.size == 999_887
    assert len(b.txs) == 1557
    assert sum(len(t.inputs) for t in b.txs) == 4887  # the coinbase's one input included
    assert b.header.version == 4
    assert b.header.bits == 0x18058436


def test_block_277647_height_and_counts(block_277647: Block) -> None:
    b = block_277647
    assert bip34_height(b) == 277647
    assert len(b.txs) == 213
    assert b.size == 149_164
    assert b.hash_hex.startswith("0000000000000000")


def test_blocks_1_to_255_parse_and_check_out(blocks_1_255: list[Block]) -> None:
    assert len(blocks_1_255) == 255
    for block in blocks_1_255:
        assert_sound(block)
        assert block.header.version == 1
        assert bip34_height(block) is None


def test_blocks_1_to_255_link_up_from_genesis(blocks_1_255: list[Block]) -> None:
    assert blocks_1_255[0].header.prev_hash_hex == MAINNET_GENESIS
    assert blocks_1_255[0].hash_hex == BLOCK_1_HASH
    for parent, child in pairwise(blocks_1_255):
        assert child.header.prev_hash == parent.hash
        assert child.header.timestamp > parent.header.timestamp - 2 * 3600
    assert len({b.hash for b in blocks_1_255}) == 255


def test_blocks_1_to_255_work_is_difficulty_one(blocks_1_255: list[Block]) -> None:
    assert {b.header.bits for b in blocks_1_255} == {0x1D00FFFF}
    assert sum(block_work(b.header.bits) for b in blocks_1_255) == 255 * 0x100010001


def test_blk_offsets_point_at_the_blocks(blk_file: bytes) -> None:
    records = list(iter_blk_records(blk_file))
    assert [off for off, _ in records][:1] == [8]
    for off, block in records:
        assert blk_file[off - 8 : off - 4] == bytes.fromhex("f9beb4d9")
        assert int.from_bytes(blk_file[off - 4 : off], "little") == len(block)
        assert blk_file[off : off + len(block)] == block


def test_btc_segwit_block_is_refused_never_misparsed(data_dir: Path) -> None:
    data = (data_dir / "btc-segwit-574200.block").read_bytes()
    with pytest.raises(ParseError) as e:
        parse_block(data)
    assert "SegWit" in str(e.value)
    assert "transaction 0 of 3315" in e.value.what  # the coinbase is the first witness tx
    assert e.value.offset == 80 + 3 + 4  # header, count varint (fd f30c), version: the marker


def test_merkle_root_of_real_txids_is_order_sensitive(block_277647: Block) -> None:
    txids = [t.txid for t in block_277647.txs]
    root, _ = merkle_root(txids)
    assert root == block_277647.header.merkle_root
    swapped = [txids[1], txids[0], *txids[2:]]
    assert merkle_root(swapped)[0] != root
