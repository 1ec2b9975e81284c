"""Reading blocks for `utxo enqueue`: every block of a file checked before any is sent, and only
its hash, size and bytes kept; the stored copy of a block is replaced only by a genuine one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chain import iter_blk_records, parse_block
from stores.blob import open_blob_store
from stores.blob.protocol import blob_key
from tests.pipeline.chains import Chain, assemble
from workers.chainstate.blockindex import keep_block, stated_height
from workers.runtime import ingest, procmap
from workers.runtime.ingest import CheckedBlock, InputError, read_blocks


def test_read_blocks_keeps_hash_size_and_bytes_and_the_header_fields_the_index_needs() -> None:
    c = Chain()
    for _ in range(3):
        c.add()
    text = b"".join(raw.hex().encode() + b"\n" for raw in c.blocks)
    got = read_blocks(text, "chain.hex")
    assert got == [
        CheckedBlock(b.hash, len(b.txs), r, b.header.prev_hash, stated_height(b),
                     f"chain.hex: block {k} of 3 (line {k})", b.header.bits)
        for k, (r, b) in enumerate(((r, parse_block(r)) for r in c.blocks), 1)
    ]
    assert got[0].hash_hex == parse_block(c.blocks[0]).hash_hex
    one = read_blocks(c.blocks[1])  # one binary block
    assert [(b.hash, b.raw, b.where) for b in one] == [(got[1].hash, got[1].raw, "input: block 1 of 1")]
    broken = text[:-41] + b"\n"  # the last block cut short: the file is refused whole
    with pytest.raises(InputError, match=r"chain\.hex: block 3 of 3 \(line 3\): transaction 0 of 1: trunc"):
        read_blocks(broken, "chain.hex")
    with pytest.raises(InputError, match=r"chain\.hex: line 3 has an odd number of hex digits"):
        read_blocks(text[:-42] + b"\n", "chain.hex")


def test_a_blk_file_is_read_and_a_bad_block_in_it_named() -> None:
    c = Chain()
    for _ in range(3):
        c.add()
    magic = bytes.fromhex("e3e1f3e8")

    def blk(raws: list[bytes]) -> bytes:
        return b"".join(magic + len(r).to_bytes(4, "little") + r for r in raws) + bytes(64)

    got = read_blocks(blk(c.blocks), "blk00000.dat")
    assert [b.hash for b in got] == [parse_block(r).hash for r in c.blocks]
    assert [b.raw for b in got] == c.blocks
    bad = c.blocks[1] + b"\x00"  # length says one byte more than the block: trailing bytes
    at = 8 + len(c.blocks[0])
    with pytest.raises(InputError, match=rf"blk00000\.dat: block 2 of 3 \(blk record at byte offset {at}\): "
                       rf"1 trailing bytes after the last transaction \(at byte offset "
                       rf"{at + 8 + len(c.blocks[1]):,} of the file\)"):
        read_blocks(blk([c.blocks[0], bad, c.blocks[2]]), "blk00000.dat")


def test_a_genuine_copy_replaces_a_corrupted_one_without_being_parsed_first(tmp_path: Path) -> None:
    c = Chain()
    c.add()
    good = c.blocks[0]
    blk = parse_block(good)
    bad = assemble(good[:80], [*blk.txs, blk.txs[-1]])  # the same hash, a duplicated last tx
    blobs = open_blob_store(f"file://{tmp_path}/blobs")
    keep_block(blobs, blk.hash, bad)
    assert blobs.get(blob_key(blk.hash, "block")) == bad
    keep_block(blobs, blk.hash, bad)  # again: still the first copy (nothing better came)
    keep_block(blobs, blk.hash, good)  # the genuine one: it replaces the corrupted copy
    assert blobs.get(blob_key(blk.hash, "block")) == good
    keep_block(blobs, blk.hash, bad)  # a corrupted copy never replaces a genuine one
    assert blobs.get(blob_key(blk.hash, "block")) == good


# -- a large input checked in several processes (workers.runtime.procmap) -----------------------------
BLK = "mainnet-1-255.blk"


@pytest.fixture
def parallel_from_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check in several processes whatever the input's size (a real file of 255 mainnet blocks
    is 58 KB: far below the size from which `utxo enqueue` forks)."""
    monkeypatch.setattr(ingest, "PARALLEL_FROM_BYTES", 0)


def blk_with(data: bytes, k: int, flip: int) -> bytes:
    """The blk file with one byte of record k's block (1-based) flipped, `flip` bytes past its
    header: a transaction that no longer matches the merkle root."""
    off, _rec = list(iter_blk_records(data))[k - 1]
    out = bytearray(data)
    out[off + 80 + flip] ^= 1
    return bytes(out)


@pytest.mark.usefixtures("parallel_from_any_size")
@pytest.mark.parametrize("processes", [2, 3, 8])
def test_in_several_processes_the_blocks_and_the_refusals_are_those_of_one(
    data_dir: Path, processes: int
) -> None:
    data = (data_dir / BLK).read_bytes()
    one = read_blocks(data, BLK)
    assert len(one) == 255 and read_blocks(data, BLK, processes) == one
    text = b"".join(b.raw.hex().encode() + b"\n" for b in one)
    assert read_blocks(text, "chain.hex", processes) == read_blocks(text, "chain.hex")
    # a bad block in the last range, then one in a middle range too: the first is named, as by one
    for bad in ([250], [130, 250], [3, 250]):
        broken = data
        for k in bad:
            broken = blk_with(broken, k, 45)
        with pytest.raises(InputError) as serial:
            read_blocks(broken, BLK)
        assert f"block {bad[0]} of 255" in str(serial.value)
        with pytest.raises(InputError) as parallel:
            read_blocks(broken, BLK, processes)
        assert str(parallel.value) == str(serial.value)


@pytest.mark.usefixtures("parallel_from_any_size")
def test_a_child_that_dies_has_its_range_checked_here(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Fault injection: every forked child exits at once, before it answers; the answer is the
    same, and nothing is said on stderr."""
    data = (data_dir / BLK).read_bytes()
    monkeypatch.setattr(procmap, "_child", lambda *_a: os._exit(3))
    assert read_blocks(data, BLK, 4) == read_blocks(data, BLK)
    with pytest.raises(InputError, match="block 200 of 255"):
        read_blocks(blk_with(data, 200, 45), BLK, 4)
    assert capfd.readouterr().err == ""


def test_a_child_whose_work_fails_says_nothing_and_its_range_is_done_here(
    data_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A child's own exception (here: its range's work raising in the child only) leaves no
    traceback on stderr; the parent does the range."""
    parent = os.getpid()

    def work(lo: int, hi: int) -> list[int]:
        if os.getpid() != parent:
            raise RuntimeError("a child's failure")
        return list(range(lo, hi))

    assert procmap.map_ranges(10, 3, work) == list(range(10))
    assert capfd.readouterr().err == ""


def test_output_buffered_before_the_fork_is_written_once() -> None:
    """A child flushes the standard streams it inherited as it exits: what the caller had
    buffered (stdout to a pipe is block-buffered) must not come out once per child."""
    code = ("import sys\nfrom workers.runtime import procmap\nprint('before', end='')\n"
            "print(procmap.map_ranges(6, 3, lambda lo, hi: list(range(lo, hi))))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 0 and r.stdout == "before[0, 1, 2, 3, 4, 5]\n", (r.stdout, r.stderr)
