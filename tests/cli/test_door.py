"""Bad input stopped at the door: `utxo enqueue` refuses (exit 2, one line naming the input and the
place in it, nothing enqueued) a block whose transactions or proof of work do not match its
header, hex text with a typo or a dropped digit, an empty file, a cut `blk*.dat` file, and blocks
that can never join the chain continuing the store's UTXO snapshot. Real mainnet blocks, a real
Redis database claimed for each test (nothing may reach it but the claim)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from chain import iter_blk_records, parse_block, parse_header
from stores.state import open_state_store
from tests.cli.conftest import PREVOUTS, SNAPSHOT_HEIGHT, Result, run_utxo
from tests.conftest import REDIS
from workers.demo.localredis import claim_database
from workers.runtime.ingest import below_snapshot_block, read_blocks
from workers.runtime.registry import Registry

BLK = "mainnet-1-255.blk"


@dataclass
class Door:
    tmp: Path
    env: dict[str, str]

    def run(self, *args: str, stdin: str | None = None) -> Result:
        return run_utxo(*args, cwd=self.tmp, env=self.env, stdin=stdin)

    def write(self, name: str, data: str | bytes) -> str:
        path = self.tmp / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return name

    def refused(self, r: Result, *needles: str) -> str:
        """`r` is a refusal: exit 2, nothing on stdout, one line naming what is wrong, and
        nothing registered or sent."""
        assert r.code == 2 and r.out == "", (r.code, r.out, r.err)
        (line,) = r.err_lines
        assert line.startswith("utxo: error: ") and line.endswith("; nothing was enqueued"), line
        for n in needles:
            assert n in line, (n, line)
        state = open_state_store(self.env["UTXO_STATE_URL"])
        try:
            assert Registry(state).pending() == set()
        finally:
            state.close()
        assert redis.Redis.from_url(self.env["UTXO_BROKER_URL"]).dbsize() == 1  # the claim alone
        return line


@pytest.fixture
def door(tmp_path: Path) -> Iterator[Door]:
    claimed = claim_database(f"{REDIS}/0")
    env = {
        "UTXO_STORE_URL": f"sqlite:///{tmp_path}/utxo.db",
        "UTXO_STATE_URL": f"sqlite:///{tmp_path}/state.db",
        "UTXO_BLOB_URL": f"file://{tmp_path}/blobs",
        "UTXO_BROKER_URL": claimed.url,
    }
    try:
        yield Door(tmp_path, env)
    finally:
        claimed.release()


def changed(text: str, i: int) -> str:
    """`text` with its digit at `i` changed."""
    return text[:i] + ("1" if text[i] != "1" else "2") + text[i + 1 :]


def test_a_block_with_one_digit_changed_is_refused_naming_it(door: Door, data_dir: Path) -> None:
    raw = (data_dir / "mainnet-277647.block").read_bytes()
    hexed = raw.hex()
    # a digit of a transaction: the header (and so the hash) stays, its merkle root no longer matches
    door.write("body.hex", changed(hexed, 2 * 50_000) + "\n")
    door.refused(door.run("enqueue", "block", "body.hex"), "body.hex: block 1 of 1 (line 1)",
                 parse_block(raw).hash_hex, "merkle root does not match its transactions")
    # a digit of the nonce: another hash, nowhere near the target its bits state
    header = changed(hexed, 2 * 76)
    door.write("header.hex", header + "\n")
    door.refused(door.run("enqueue", "block", "header.hex"), "header.hex: block 1 of 1 (line 1)",
                 parse_header(bytes.fromhex(header[:160])).hash_hex, "proof of work does not meet its bits")
    # one block among many: the 36th of a blk file, named by its number and its record's offset
    blk = bytearray((data_dir / BLK).read_bytes())
    off, rec = list(iter_blk_records(bytes(blk)))[35]
    blk[off + len(rec) - 10] ^= 1  # its coinbase's output script
    door.write("blk00000.dat", bytes(blk))
    door.refused(door.run("enqueue", "block", "blk00000.dat"),
                 f"blk00000.dat: block 36 of 255 (blk record at byte offset {off - 8:,})",
                 parse_block(rec).hash_hex, "merkle root does not match")
    # the genuine block goes in
    ok = door.run("enqueue", "block", str(data_dir / "mainnet-277647.block"))
    assert ok.code == 0 and ok.lines() == [
        {"enqueued": "block", "hash": parse_block(raw).hash_hex, "txs": 213}], ok.err


def test_a_hex_file_with_a_typo_is_named_as_hex_by_line_and_column(door: Door, data_dir: Path) -> None:
    raws = [(data_dir / f).read_bytes() for f in ("mainnet-277647.block", "mainnet-413567.block")]
    lines = [r.hex() for r in raws]
    lines[1] = lines[1][:100] + "g" + lines[1][101:]
    door.write("typo.hex", "\n".join(lines) + "\n")
    door.refused(door.run("enqueue", "block", "typo.hex"),
                 "typo.hex: line 2, column 101: 'g' is not a hex digit")
    txs = [t.raw.hex() for t in parse_block(raws[0]).txs[:3]]
    door.write("txs.hex", f"{txs[0]}\n\n{txs[1]}\n{txs[2][:7]}\u00e9{txs[2][8:]}\n")  # a UTF-8 é
    door.refused(door.run("enqueue", "tx", "txs.hex"),
                 "txs.hex: line 4, column 8: byte 0xc3 is not a hex digit")


def test_a_dropped_hex_digit_names_the_line_and_says_the_count_is_odd(door: Door, data_dir: Path) -> None:
    raws = [(data_dir / f).read_bytes() for f in ("mainnet-277647.block", "mainnet-413567.block")]
    lines = [r.hex() for r in raws]
    door.write("odd.hex", f"{lines[0]}\n{lines[1][:-1]}\n")
    door.refused(door.run("enqueue", "block", "odd.hex"),
                 f"odd.hex: line 2 has an odd number of hex digits ({len(lines[1]) - 1:,})")
    tx = parse_block(raws[0]).txs[1].raw.hex()
    door.write("tx.hex", tx[:10] + tx[11:] + "\n")
    door.refused(door.run("enqueue", "tx", "tx.hex"), "tx.hex: line 1 has an odd number of hex digits")


@pytest.mark.parametrize("kind", ["block", "tx"])
def test_an_empty_file_is_refused_by_name(door: Door, kind: str) -> None:
    door.write("empty.hex", "")
    door.refused(door.run("enqueue", kind, "empty.hex"), "empty.hex is empty")
    door.write("blank.hex", "\n \n")
    door.refused(door.run("enqueue", kind, "blank.hex"), "blank.hex is empty")
    door.refused(door.run("enqueue", kind, "-", stdin=""), "stdin is empty")


def test_a_cut_blk_file_names_its_cut_record(door: Door, data_dir: Path) -> None:
    data = (data_dir / BLK).read_bytes()
    recs = list(iter_blk_records(data))
    for k, keep in ((137, 10), (255, 100), (1, 50)):  # bytes of record k's block left
        off, rec = recs[k - 1]
        door.write("cut.blk", data[: off + keep])
        line = door.refused(
            door.run("enqueue", "block", "cut.blk"),
            f"cut.blk: blk record {k} is cut: it claims {len(rec):,} bytes and {keep:,} remain",
            f"(at byte offset {off - 8})",
        )
        assert "transaction count" not in line


def test_blocks_below_the_snapshot_are_refused_naming_the_first_and_the_base(
    door: Door, data_dir: Path, snapshot_block_hash: str
) -> None:
    r = door.run("import-utxos", str(data_dir / PREVOUTS), "--height", str(SNAPSHOT_HEIGHT),
                 "--block-hash", snapshot_block_hash)
    assert r.code == 0, r.err
    base = f"block {snapshot_block_hash} at height {SNAPSHOT_HEIGHT:,}"
    blk = list(iter_blk_records((data_dir / BLK).read_bytes()))
    door.refused(door.run("enqueue", "block", str(data_dir / BLK)),  # heights from the genesis' child
                 f"{BLK}: block 1 of 255 (blk record at byte offset 0), {parse_block(blk[0][1]).hash_hex}, "
                 "is at height 1", base)
    old = (data_dir / "mainnet-277647.block").read_bytes()  # its BIP34 height
    door.refused(door.run("enqueue", "block", str(data_dir / "mainnet-277647.block")),
                 f"{parse_block(old).hash_hex}, is at height 277,647", base)
    new = (data_dir / "mainnet-413567.block").read_bytes()  # the chain's continuation
    door.write("both.hex", f"{new.hex()}\n{old.hex()}\n")
    door.refused(door.run("enqueue", "block", "both.hex"), "both.hex: block 2 of 2 (line 2)", base)
    ok = door.run("enqueue", "block", str(data_dir / "mainnet-413567.block"))
    assert ok.code == 0 and [b["hash"] for b in ok.lines()] == [parse_block(new).hash_hex], ok.err


def test_heights_follow_parents_in_any_order(data_dir: Path) -> None:
    """A block's height is the one it states, else its parent's plus one (its parent among the
    blocks read, in any order, or the snapshot's block); else it has none and is not refused."""
    data = (data_dir / BLK).read_bytes()
    blocks = read_blocks(data, BLK)  # version 1: no BIP34 height; block 1 follows the genesis
    assert [b.height for b in blocks[:3]] == [1, None, None]
    first = below_snapshot_block(list(reversed(blocks[:5])), (3, b"\x01" * 32))
    assert first is not None and (first[0].hash, first[1]) == (blocks[2].hash, 3)  # 5 and 4 are above
    assert below_snapshot_block(blocks[1:5], (3, b"\x01" * 32)) is None  # no height known
    assert below_snapshot_block(blocks[1:5], (1, blocks[0].hash)) is None  # they continue the snapshot
    assert below_snapshot_block(blocks[:5], (1, blocks[0].hash)) is None  # and the snapshot's block itself
