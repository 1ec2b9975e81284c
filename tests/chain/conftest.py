"""Real mainnet data for the chain tests, read and parsed once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chain import Block, Tx, hex_to_hash, iter_blk_records, parse_block, parse_tx

MAINNET_GENESIS = "000000000019d6689c085ae165831e934ff763ae46a2a6c172b3f1b60a8ce26f"

Prevouts = dict[tuple[bytes, int], tuple[int, bytes]]


def load_prevouts(path: Path) -> Prevouts:
    """(txid internal order, vout) → (satoshis, script) from a prevouts.jsonl file."""
    out: Prevouts = {}
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            out[(hex_to_hash(r["txid"]), r["vout"])] = (r["value"], bytes.fromhex(r["script"]))
    return out


@pytest.fixture(scope="session")
def block_413567_bytes(data_dir: Path) -> bytes:
    return (data_dir / "mainnet-413567.block").read_bytes()


@pytest.fixture(scope="session")
def block_413567(block_413567_bytes: bytes) -> Block:
    return parse_block(block_413567_bytes)


@pytest.fixture(scope="session")
def block_277647_bytes(data_dir: Path) -> bytes:
    return (data_dir / "mainnet-277647.block").read_bytes()


@pytest.fixture(scope="session")
def block_277647(block_277647_bytes: bytes) -> Block:
    return parse_block(block_277647_bytes)


@pytest.fixture(scope="session")
def blk_file(data_dir: Path) -> bytes:
    return (data_dir / "mainnet-1-255.blk").read_bytes()


@pytest.fixture(scope="session")
def blocks_1_255(blk_file: bytes) -> list[Block]:
    return [parse_block(b) for _off, b in iter_blk_records(blk_file)]


@pytest.fixture(scope="session")
def megatx_bytes(data_dir: Path) -> bytes:
    return (data_dir / "mainnet-megatx-bb41a757.tx").read_bytes()


@pytest.fixture(scope="session")
def megatx(megatx_bytes: bytes) -> Tx:
    return parse_tx(megatx_bytes)


@pytest.fixture(scope="session")
def prevouts_413567(data_dir: Path) -> Prevouts:
    return load_prevouts(data_dir / "mainnet-413567.prevouts.jsonl")


@pytest.fixture(scope="session")
def prevouts_277647(data_dir: Path) -> Prevouts:
    return load_prevouts(data_dir / "mainnet-277647.prevouts.jsonl")
