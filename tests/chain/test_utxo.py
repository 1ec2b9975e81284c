"""The UTXO hash (a fixed vector) and the data-carrier rule."""

from __future__ import annotations

from hashlib import sha256

import pytest

from chain import Block, hash_to_hex, hex_to_hash, is_data_carrier, utxo_hash
from chain.tx import varint

VECTOR_TXID = "2fb09ea4d1d282f55b4f4b5b1eec92fa314e1ba5a5a009e897f63d155b4dba82"
VECTOR_SCRIPT = "76a914d687c76d6ee133c9cc42bd96e3947d8a84bdf60288ac"
VECTOR_SATOSHIS = 1_149_996_160
VECTOR_HASH = "8ef53bb4c9c4b849c30ec75243bad8a7eafd83f407407a154a6d9ec80d83dd00"


def test_utxo_hash_vector() -> None:
    h = utxo_hash(hex_to_hash(VECTOR_TXID), 0, bytes.fromhex(VECTOR_SCRIPT), VECTOR_SATOSHIS)
    assert len(h) == 32
    assert hash_to_hex(h) == VECTOR_HASH


def test_utxo_hash_depends_on_every_field() -> None:
    txid = hex_to_hash(VECTOR_TXID)
    script = bytes.fromhex(VECTOR_SCRIPT)
    base = utxo_hash(txid, 0, script, VECTOR_SATOSHIS)
    assert utxo_hash(txid, 1, script, VECTOR_SATOSHIS) != base
    assert utxo_hash(txid, 0, script + b"\x00", VECTOR_SATOSHIS) != base
    assert utxo_hash(txid, 0, script, VECTOR_SATOSHIS + 1) != base
    assert utxo_hash(txid[::-1], 0, script, VECTOR_SATOSHIS) != base  # internal order, not display
    # VarInt-encoded vout and satoshis (a vout of 253+ takes three bytes).
    assert utxo_hash(txid, 300, script, 5) == sha256(txid + b"\xfd\x2c\x01" + script + b"\x05").digest()
    assert varint(VECTOR_SATOSHIS) == b"\xfe" + VECTOR_SATOSHIS.to_bytes(4, "little")


@pytest.mark.parametrize(
    ("satoshis", "script", "carrier"),
    [
        (0, bytes.fromhex("6a"), True),
        (0, bytes.fromhex("6a0568656c6c6f"), True),
        (0, bytes.fromhex("006a"), True),
        (0, bytes.fromhex("006a0568656c6c6f"), True),
        (1, bytes.fromhex("6a0568656c6c6f"), False),  # a valued OP_RETURN is still an output
        (1, bytes.fromhex("006a0568656c6c6f"), False),
        (0, bytes.fromhex(VECTOR_SCRIPT), False),
        (0, b"", False),
        (0, bytes.fromhex("00"), False),
        (0, bytes.fromhex("0000"), False),
        (0, bytes.fromhex("516a"), False),  # OP_1 OP_RETURN
        (0, bytes.fromhex("00006a"), False),
        (VECTOR_SATOSHIS, bytes.fromhex(VECTOR_SCRIPT), False),
    ],
)
def test_data_carrier_rule(satoshis: int, script: bytes, carrier: bool) -> None:
    assert is_data_carrier(satoshis, script) is carrier


def test_data_carriers_in_a_real_block(block_413567: Block) -> None:
    outputs = [o for t in block_413567.txs for o in t.outputs]
    carriers = [o for o in outputs if is_data_carrier(o.satoshis, o.script)]
    assert all(o.satoshis == 0 and o.script[:1] in (b"\x6a", b"\x00") for o in carriers)
    assert len(carriers) < len(outputs) // 10
    # The coinbase's witness-commitment-free payouts are ordinary outputs.
    assert not any(is_data_carrier(o.satoshis, o.script) for o in block_413567.txs[0].outputs if o.satoshis)


def test_the_fast_form_agrees_with_utxo_hash_at_every_varint_width() -> None:
    """`utxo_hashes` (the create path's fast form) gives `utxo_hash` of every output, None for a
    data carrier, across the VarInt boundaries of both vout and satoshis."""
    from chain import utxo_hashes
    from chain.tx import TxOut

    txid = hex_to_hash(VECTOR_TXID)
    amounts = [0, 1, 0xFC, 0xFD, 0xFFFF, 0x10000, 0xFFFFFFFF, 0x100000000, 21 * 10**14]
    scripts = [b"", b"\x51", bytes.fromhex(VECTOR_SCRIPT), b"\x6a\x01", b"\x00\x6a", b"\x00\x6b"]
    outs = [TxOut(a, s) for a in amounts for s in scripts]
    for start in (0, 0xFC - 3, 0xFFFF - 10, 0x10000):
        got = utxo_hashes(txid, outs, start)
        want = [
            None if is_data_carrier(o.satoshis, o.script)
            else utxo_hash(txid, start + k, o.script, o.satoshis)
            for k, o in enumerate(outs)
        ]
        assert got == want
        assert sum(h is None for h in got) == 2  # the zero-satoshi 6a and 006a outputs


def test_the_inputs_fast_form_agrees_with_utxo_hash() -> None:
    """`spent_hashes` gives `utxo_hash` of each input's previous output, None without one."""
    from chain import TxIn, spent_hashes

    txid = hex_to_hash(VECTOR_TXID)
    script = bytes.fromhex(VECTOR_SCRIPT)
    ins = [TxIn(txid, v, b"", 0, sats, script) for v in (0, 0xFC, 0xFD, 70000) for sats in (0, 0xFD, 2**33)]
    ins.append(TxIn(txid, 3, b"", 0))
    want = [utxo_hash(txid, i.prev_vout, script, i.prev_satoshis) for i in ins[:-1]] + [None]  # type: ignore[arg-type]
    assert spent_hashes(ins) == want
