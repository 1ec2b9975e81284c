"""Transactions: a 1 MB real transaction, BIP-239 extended format with real previous outputs,
and the helpers on Tx (coinbase, inpoints, fee)."""

from __future__ import annotations

import dataclasses

import pytest

from chain import (
    COINBASE_PREV_TXID,
    COINBASE_PREV_VOUT,
    Block,
    ParseError,
    Tx,
    TxIn,
    parse_block,
    parse_tx,
    sha256d,
)
from chain.tx import EXTENDED_MARKER, read_tx
from tests.chain.conftest import Prevouts

SUBSIDY_413567 = 25 * 10**8
FEES_413567 = 31_310_238


def with_prevouts(tx: Tx, prevouts: Prevouts) -> Tx:
    """The same transaction with every input carrying its previous output (coinbase: none)."""
    if tx.is_coinbase:
        return dataclasses.replace(tx, inputs=[dataclasses.replace(i) for i in tx.inputs])
    inputs = []
    for i in tx.inputs:
        sats, script = prevouts[(i.prev_txid, i.prev_vout)]
        inputs.append(dataclasses.replace(i, prev_satoshis=sats, prev_script=script))
    return dataclasses.replace(tx, inputs=inputs)


def test_megatx_parses_and_round_trips(megatx_bytes: bytes, megatx: Tx) -> None:
    assert len(megatx_bytes) == 999_657
    assert len(megatx.inputs) == 5569
    assert megatx.txid_hex.startswith("bb41a757")
    assert megatx.raw == megatx_bytes
    assert megatx.serialize() == megatx_bytes
    assert megatx.size == len(megatx_bytes)
    assert megatx.txid == sha256d(megatx_bytes)
    assert not megatx.is_coinbase
    assert megatx.fee() is None  # prevouts unknown
    assert not megatx.is_extended
    assert len(megatx.inpoints()) == 5569
    assert all(i.prev_satoshis is None and i.prev_script is None for i in megatx.inputs)


def test_megatx_read_at_an_offset_inside_a_larger_buffer(megatx_bytes: bytes, megatx: Tx) -> None:
    buf = b"\xaa" * 7 + megatx_bytes + b"\xbb" * 5
    tx, end = read_tx(buf, 7)
    assert end == 7 + len(megatx_bytes)
    assert tx == megatx
    with pytest.raises(ParseError, match="5 trailing bytes") as e:
        parse_tx(megatx_bytes + b"\xbb" * 5)
    assert e.value.offset == len(megatx_bytes)
    assert parse_tx(megatx_bytes + b"\xbb" * 5, allow_trailing=True) == megatx


def test_parse_tx_accepts_bytearray_and_memoryview(block_413567: Block) -> None:
    tx = block_413567.txs[7]
    assert parse_tx(bytearray(tx.raw)) == tx
    assert parse_tx(memoryview(tx.raw)) == tx
    assert isinstance(parse_tx(memoryview(tx.raw)).raw, bytes)


def test_every_tx_of_block_413567_reparses_alone(block_413567: Block) -> None:
    for tx in block_413567.txs:
        again = parse_tx(tx.raw)
        assert again == tx
        assert again.serialize() == tx.raw


def test_coinbase_and_inpoints(block_413567: Block) -> None:
    cb = block_413567.txs[0]
    assert cb.is_coinbase
    assert cb.inputs[0].prev_txid == COINBASE_PREV_TXID
    assert cb.inputs[0].prev_vout == COINBASE_PREV_VOUT
    assert cb.inpoints() == []
    assert cb.fee() == 0
    spend = block_413567.txs[75]
    assert spend.inpoints() == [(i.prev_txid, i.prev_vout) for i in spend.inputs]
    assert len(spend.inpoints()) == 3


def test_extended_round_trip_of_a_real_tx(block_413567: Block, prevouts_413567: Prevouts) -> None:
    tx = block_413567.txs[109]  # 6 inputs, 2 outputs
    ext_tx = with_prevouts(tx, prevouts_413567)
    assert ext_tx.is_extended
    ext = ext_tx.serialize(extended=True)
    assert ext[4:10] == EXTENDED_MARKER
    assert ext != tx.raw and len(ext) > len(tx.raw)
    back = parse_tx(ext)
    assert back.txid == tx.txid
    assert back.raw == tx.raw  # raw stays the standard serialization
    assert back.serialize() == tx.raw
    assert back.is_extended
    assert back.inputs == ext_tx.inputs
    assert back.outputs == tx.outputs
    total_in = sum(prevouts_413567[p][0] for p in tx.inpoints())
    fee = back.fee()
    assert fee == total_in - sum(o.satoshis for o in tx.outputs)
    assert fee is not None and fee > 0
    assert back.serialize(extended=True) == ext


def test_extended_round_trip_of_every_tx_gives_the_block_fees(
    block_413567: Block, prevouts_413567: Prevouts
) -> None:
    fees = 0
    for tx in block_413567.txs[1:]:
        back = parse_tx(with_prevouts(tx, prevouts_413567).serialize(extended=True))
        assert back.txid == tx.txid and back.raw == tx.raw
        fee = back.fee()
        assert fee is not None and fee >= 0
        fees += fee
    assert fees == FEES_413567
    coinbase_out = sum(o.satoshis for o in block_413567.txs[0].outputs)
    assert coinbase_out - SUBSIDY_413567 == FEES_413567


def test_extended_round_trip_of_block_277647(block_277647: Block, prevouts_277647: Prevouts) -> None:
    for tx in block_277647.txs[1:]:
        back = parse_tx(with_prevouts(tx, prevouts_277647).serialize(extended=True))
        assert back.txid == tx.txid and back.raw == tx.raw and back.is_extended


def test_extended_coinbase_carries_no_prevout(block_413567: Block) -> None:
    cb = block_413567.txs[0]
    ext = cb.serialize(extended=True)
    assert ext[4:10] == EXTENDED_MARKER
    back = parse_tx(ext)
    assert back.txid == cb.txid and back.raw == cb.raw
    assert back.is_coinbase and back.fee() == 0
    assert back.inputs[0].prev_satoshis is None and back.inputs[0].prev_script is None


def test_extended_serialize_needs_every_prevout(block_413567: Block, prevouts_413567: Prevouts) -> None:
    tx = block_413567.txs[109]
    assert not tx.is_extended
    with pytest.raises(ValueError, match="previous output"):
        tx.serialize(extended=True)
    ext_tx = with_prevouts(tx, prevouts_413567)
    ext_tx.inputs[3] = dataclasses.replace(ext_tx.inputs[3], prev_script=None)
    assert not ext_tx.is_extended and ext_tx.fee() is not None
    with pytest.raises(ValueError):
        ext_tx.serialize(extended=True)
    ext_tx.inputs[2] = dataclasses.replace(ext_tx.inputs[2], prev_satoshis=None)
    assert ext_tx.fee() is None


def test_extended_tx_inside_a_block_is_refused(
    block_277647_bytes: bytes, block_277647: Block, prevouts_277647: Prevouts
) -> None:
    k = 5
    target = block_277647.txs[k]
    start = len(block_277647_bytes) - sum(t.size for t in block_277647.txs[k:])
    assert block_277647_bytes[start : start + target.size] == target.raw
    ext = with_prevouts(target, prevouts_277647).serialize(extended=True)
    bad = block_277647_bytes[:start] + ext + block_277647_bytes[start + target.size :]
    with pytest.raises(ParseError, match="extended") as e:
        parse_block(bad)
    assert f"transaction {k} of 213" in e.value.what
    assert e.value.offset == start


def test_tx_built_from_parts_computes_its_txid(block_413567: Block) -> None:
    tx = block_413567.txs[3]
    rebuilt = Tx(tx.version, list(tx.inputs), list(tx.outputs), tx.locktime, tx.raw)
    assert rebuilt.txid == tx.txid and rebuilt == tx
    i = tx.inputs[0]
    assert TxIn(i.prev_txid, i.prev_vout, i.script_sig, i.sequence) == i
    assert TxIn(i.prev_txid, i.prev_vout, i.script_sig, i.sequence, 5, b"") != i
