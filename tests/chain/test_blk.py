"""Bitcoin Core blk*.dat framing: any network magic, trailing zero padding, truncation."""

from __future__ import annotations

import pytest

from chain import ParseError, iter_blk_records, parse_block

MAINNET_MAGIC = bytes.fromhex("f9beb4d9")
TESTNET_MAGIC = bytes.fromhex("0b110907")


def with_magic(blk: bytes, magic: bytes) -> bytes:
    out = bytearray(blk)
    for off, _block in iter_blk_records(blk):
        out[off - 8 : off - 4] = magic
    return bytes(out)


def test_mainnet_file(blk_file: bytes) -> None:
    records = list(iter_blk_records(blk_file))
    assert len(records) == 255
    assert records[0][0] == 8
    assert records[-1][0] + len(records[-1][1]) == len(blk_file)


def test_testnet_magic_is_read_alike(blk_file: bytes) -> None:
    testnet = with_magic(blk_file, TESTNET_MAGIC)
    assert testnet != blk_file and testnet[:4] == TESTNET_MAGIC
    assert testnet.count(MAINNET_MAGIC) == 0
    assert list(iter_blk_records(testnet)) == list(iter_blk_records(blk_file))


def test_mixed_magic_is_refused(blk_file: bytes) -> None:
    records = list(iter_blk_records(blk_file))
    off = records[3][0]
    mixed = blk_file[: off - 8] + TESTNET_MAGIC + blk_file[off - 4 :]
    it = iter_blk_records(mixed)
    assert [next(it) for _ in range(3)] == records[:3]
    with pytest.raises(ParseError, match="magic 0b110907 differs from f9beb4d9") as e:
        next(it)
    assert e.value.offset == off - 8


@pytest.mark.parametrize("pad", [1, 3, 4, 7, 8, 9, 64, 65, 4096, 1 << 20])
def test_trailing_zero_padding_is_fine(blk_file: bytes, pad: int) -> None:
    records = list(iter_blk_records(blk_file + b"\x00" * pad))
    assert len(records) == 255
    assert records == list(iter_blk_records(blk_file))


def test_zeros_followed_by_data_are_an_error_not_the_end(blk_file: bytes) -> None:
    first_len = int.from_bytes(blk_file[4:8], "little")
    one = blk_file[: 8 + first_len]
    # Padding and then another record: the record must not be silently dropped.
    for gap in (8, 64, 100):
        with pytest.raises(ParseError) as e:
            list(iter_blk_records(one + b"\x00" * gap + one))
        assert e.value.offset == len(one)


def test_truncated_record_is_refused(blk_file: bytes) -> None:
    records = list(iter_blk_records(blk_file))
    last_off = records[-1][0]
    with pytest.raises(ParseError, match="runs past the end") as e:
        list(iter_blk_records(blk_file[:-1]))
    assert e.value.offset == last_off - 8
    for cut in (1, 4, 7):  # inside the record header
        with pytest.raises(ParseError, match="truncated blk record header") as e:
            list(iter_blk_records(blk_file[: last_off - 8 + cut]))
        assert e.value.offset == last_off - 8
    # The records before the truncated one are still yielded first.
    it = iter_blk_records(blk_file[:-1])
    assert [next(it) for _ in range(254)] == records[:254]


def test_record_too_short_for_a_block(blk_file: bytes) -> None:
    bad = MAINNET_MAGIC + (80).to_bytes(4, "little") + b"\x01" * 80
    with pytest.raises(ParseError, match="too short"):
        list(iter_blk_records(bad))
    with pytest.raises(ParseError, match="too short"):
        list(iter_blk_records(blk_file + MAINNET_MAGIC + b"\x00" * 4 + b"\x01" * 8))


def test_empty_file_and_zeros_only() -> None:
    assert list(iter_blk_records(b"")) == []
    assert list(iter_blk_records(b"\x00" * 1000)) == []


def test_records_parse_as_blocks(blk_file: bytes) -> None:
    for _off, block in list(iter_blk_records(blk_file))[:5]:
        assert parse_block(block).header.version == 1
