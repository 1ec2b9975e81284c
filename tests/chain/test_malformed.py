"""Malformed bytes are refused with a ParseError that names the problem and the byte offset,
never an IndexError, struct.error or MemoryError, and never a silent misparse."""

from __future__ import annotations

import random
import re
import struct
import time
import tracemalloc
from collections.abc import Callable

import pytest

from chain import Block, ParseError, Tx, parse_block, parse_tx
from chain.tx import read_tx, varint
from tests.chain.conftest import Prevouts
from tests.chain.test_tx import with_prevouts

TRUNCATED = re.compile(r"truncated|exceeds|cut short|missing|runs past")


def refused(parse: Callable[[bytes], object], data: bytes) -> ParseError:
    """Parse must raise ParseError (anything else propagates and fails the test)."""
    with pytest.raises(ParseError) as e:
        parse(data)
    err = e.value
    assert isinstance(err.offset, int) and 0 <= err.offset <= len(data)
    assert err.what and f"offset {err.offset}" in str(err)
    return err


def tx_with_multibyte_varint(block: Block) -> Tx:
    """A real tx with a script of 253+ bytes, so a 3-byte varint is cut too."""
    for t in block.txs:
        if any(len(i.script_sig) >= 0xFD for i in t.inputs) and len(t.raw) < 1200:
            return t
    raise AssertionError("no such tx")


def test_every_cut_of_real_txs_is_refused(block_413567: Block) -> None:
    for tx in (block_413567.txs[0], block_413567.txs[109], tx_with_multibyte_varint(block_413567)):
        for cut in range(len(tx.raw)):
            err = refused(parse_tx, tx.raw[:cut])
            assert TRUNCATED.search(err.what), (cut, err.what)


def test_every_cut_of_a_real_extended_tx_is_refused(block_413567: Block, prevouts_413567: Prevouts) -> None:
    ext = with_prevouts(block_413567.txs[109], prevouts_413567).serialize(extended=True)
    for cut in range(len(ext)):
        err = refused(parse_tx, ext[:cut])
        assert TRUNCATED.search(err.what), (cut, err.what)


def test_cuts_of_the_megatx_are_refused(megatx_bytes: bytes) -> None:
    n = len(megatx_bytes)
    for cut in [0, 1, 4, 5, 6, 7, 8, 40, 41, 42, 43, 44, n // 3, n // 2, n - 50, n - 5, n - 4, n - 1]:
        err = refused(parse_tx, megatx_bytes[:cut])
        assert TRUNCATED.search(err.what), (cut, err.what)


def block_cut_points(block: Block, size: int) -> list[int]:
    """Inside the header, around the tx count, and on both sides of every tx boundary."""
    cuts = set(range(0, 90))
    pos = size - sum(t.size for t in block.txs)
    for t in block.txs:
        cuts.update((pos - 1, pos + 1, pos + 4, pos + 5, pos + 41, pos + t.size // 2))
        pos += t.size
    cuts.add(size - 1)
    return sorted(c for c in cuts if 0 <= c < size)


def test_cuts_of_a_real_block_are_refused(block_277647_bytes: bytes, block_277647: Block) -> None:
    cuts = block_cut_points(block_277647, len(block_277647_bytes))
    assert len(cuts) > 1000
    for cut in cuts:
        err = refused(parse_block, block_277647_bytes[:cut])
        assert TRUNCATED.search(err.what), (cut, err.what)


def test_cuts_of_the_1mb_block_are_refused(block_413567_bytes: bytes) -> None:
    rng = random.Random(413567)
    n = len(block_413567_bytes)
    for cut in [0, 1, 79, 80, 81, 82, 83, 84, n - 1, *rng.sample(range(84, n - 1), 25)]:
        err = refused(parse_block, block_413567_bytes[:cut])
        assert TRUNCATED.search(err.what), (cut, err.what)
        if cut > 83:
            assert err.what.startswith("transaction ") or "exceeds" in err.what


def test_empty_buffer() -> None:
    assert refused(parse_tx, b"").offset == 0
    err = refused(parse_block, b"")
    assert "header" in err.what and err.offset == 0


def test_trailing_bytes(block_413567_bytes: bytes, block_413567: Block) -> None:
    raw = block_413567.txs[1].raw
    err = refused(parse_tx, raw + b"\x00")
    assert "1 trailing bytes" in err.what and err.offset == len(raw)
    err = refused(parse_block, block_413567_bytes + b"\x00\x00")
    assert "2 trailing bytes" in err.what and err.offset == len(block_413567_bytes)


def test_garbage_bytes_are_refused() -> None:
    rng = random.Random(2459)
    for n in [1, 5, 9, 10, 11, 60, 61, 200, 1000, 5000]:
        for _ in range(20):
            garbage = rng.randbytes(n)
            refused(parse_tx, garbage)
            refused(parse_block, garbage)
    for pattern in (b"\xff" * 200, b"\x00" * 200, b"\xfd" * 200, bytes(range(256))):
        refused(parse_tx, pattern)
        refused(parse_block, pattern)


def test_random_byte_flips_parse_or_are_refused(block_413567: Block) -> None:
    """Never an exception other than ParseError; a flip that still parses re-serializes."""
    rng = random.Random(1)
    txs = block_413567.txs[:300]
    parsed = 0
    for _ in range(3000):
        raw = bytearray(rng.choice(txs).raw)
        raw[rng.randrange(len(raw))] = rng.randrange(256)
        try:
            tx = parse_tx(bytes(raw))
        except ParseError:
            continue
        parsed += 1
        assert tx.raw == bytes(raw)
    assert parsed > 1000  # most flips land in scripts, signatures and values


def assert_fast_and_small(parse: Callable[[bytes], object], data: bytes, what: str) -> ParseError:
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        err = refused(parse, data)
    finally:
        elapsed = time.perf_counter() - t0
        _cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert what in err.what
    assert elapsed < 0.5, elapsed
    assert peak < 1_000_000, peak
    return err


HUGE = 2**60


def test_huge_input_count_fails_fast() -> None:
    data = struct.pack("<I", 1) + varint(HUGE) + b"\x00" * 100
    err = assert_fast_and_small(parse_tx, data, "input count")
    assert str(HUGE) in err.what and err.offset == 13


def test_huge_output_count_fails_fast(block_413567: Block) -> None:
    tx = block_413567.txs[1]
    assert len(tx.inputs) == 1 and tx.raw[4] == 1
    script_len = len(tx.inputs[0].script_sig)
    assert script_len < 0xFD
    out_at = 4 + 1 + 36 + 1 + script_len + 4  # version, count, outpoint, varint, script, sequence
    data = tx.raw[:out_at] + varint(HUGE) + tx.raw[out_at + 1 :]
    err = assert_fast_and_small(parse_tx, data, "output count")
    assert err.offset == out_at + 9


def test_huge_script_length_fails_fast(block_413567: Block) -> None:
    tx = block_413567.txs[1]
    data = tx.raw[:41] + varint(HUGE) + tx.raw[42:]
    err = assert_fast_and_small(parse_tx, data, "input script")
    assert err.offset == 41 + 9


def test_huge_tx_count_fails_fast(block_413567_bytes: bytes) -> None:
    data = block_413567_bytes[:80] + varint(HUGE) + block_413567_bytes[83:]
    err = assert_fast_and_small(parse_block, data, "transaction count")
    assert err.offset == 89


def test_huge_extended_prev_script_fails_fast(block_413567: Block, prevouts_413567: Prevouts) -> None:
    tx = with_prevouts(block_413567.txs[1], prevouts_413567)
    ext = tx.serialize(extended=True)
    i = tx.inputs[0]
    at = 4 + 6 + 1 + 36 + 1 + len(i.script_sig) + 4 + 8  # the previous script's length
    assert i.prev_script is not None and ext[at] == len(i.prev_script)
    data = ext[:at] + varint(HUGE) + ext[at + 1 :]
    assert_fast_and_small(parse_tx, data, "previous script")


def test_tx_with_zero_inputs(block_413567: Block) -> None:
    tx = block_413567.txs[1]
    no_inputs = tx.raw[:4] + b"\x00" + b"\x00" + tx.raw[-4:]  # no inputs, no outputs, locktime
    err = refused(parse_tx, no_inputs)
    assert "no inputs" in err.what and err.offset == 4
    outputs = tx.raw[4 + 1 + 41 + len(tx.inputs[0].script_sig) :]
    assert outputs[0] == 2
    err = refused(parse_tx, tx.raw[:4] + b"\x00" + outputs)
    assert "no inputs" in err.what and err.offset == 4
    # 0x00 0x01 after the version is BTC's SegWit marker and flag: said so, not "no inputs".
    err = refused(parse_tx, tx.raw[:4] + b"\x00\x01" + tx.raw[5:])
    assert "SegWit" in err.what and err.offset == 4


def test_block_with_zero_txs(block_413567_bytes: bytes) -> None:
    err = refused(parse_block, block_413567_bytes[:80] + b"\x00")
    assert "no transactions" in err.what and err.offset == 80
    err = refused(parse_block, block_413567_bytes[:80])
    assert "transaction count missing" in err.what and err.offset == 80


def test_tx_count_larger_than_the_txs_present(block_277647_bytes: bytes, block_277647: Block) -> None:
    assert block_277647_bytes[80] == 213
    err = refused(parse_block, block_277647_bytes[:80] + b"\xd6" + block_277647_bytes[81:])
    assert err.what.startswith("transaction 213 of 214: truncated")
    assert err.offset == len(block_277647_bytes)
    err = refused(parse_block, block_277647_bytes[:80] + b"\xd4" + block_277647_bytes[81:])
    assert "trailing bytes" in err.what
    assert err.offset == len(block_277647_bytes) - block_277647.txs[-1].size


def test_non_canonical_varints_are_refused(block_413567: Block, block_277647_bytes: bytes) -> None:
    tx = block_413567.txs[1]
    # Input count 1 written as fd 01 00.
    err = refused(parse_tx, tx.raw[:4] + b"\xfd\x01\x00" + tx.raw[5:])
    assert "non-canonical" in err.what and "input count" in err.what and err.offset == 4
    # Script length written in 3 bytes.
    slen = tx.raw[41]
    err = refused(parse_tx, tx.raw[:41] + b"\xfd" + bytes((slen, 0)) + tx.raw[42:])
    assert "non-canonical" in err.what and err.offset == 41
    # 2^16 written in 9 bytes.
    err = refused(parse_tx, tx.raw[:4] + b"\xff" + (0x10000).to_bytes(8, "little") + tx.raw[5:])
    assert "non-canonical" in err.what
    # Transaction count 213 written as fd d5 00.
    err = refused(parse_block, block_277647_bytes[:80] + b"\xfd\xd5\x00" + block_277647_bytes[81:])
    assert "non-canonical" in err.what and "transaction count" in err.what and err.offset == 80


def test_errors_carry_offsets_relative_to_the_buffer(block_413567: Block) -> None:
    raw = block_413567.txs[109].raw
    pad = b"\x11" * 1000
    with pytest.raises(ParseError) as e:
        read_tx(pad + raw[:-1], len(pad))
    assert e.value.offset >= len(pad)
    tx, end = read_tx(pad + raw, len(pad))
    assert end == len(pad) + len(raw) and tx.raw == raw


def test_a_tx_reading_past_its_own_end_into_a_block_is_a_block_error(block_277647_bytes: bytes) -> None:
    """Lengthen the first output script of the coinbase by one: the parse goes astray and must
    still end in a ParseError naming a transaction, never in a wrong block."""
    data = bytearray(block_277647_bytes)
    cb = parse_block(block_277647_bytes).txs[0]
    out_script = cb.outputs[0].script
    at = bytes(data).find(bytes((len(out_script),)) + out_script)
    assert at > 0
    data[at] += 1
    err = refused(parse_block, bytes(data))
    assert err.what.startswith("transaction ")
