"""Building transactions and blocks from parts: for generated chains, tests and benchmarks.

`build_tx` returns a parsed-equivalent `Tx` (raw is the standard serialization) whose inputs
keep the previous outputs they were given, so it is also a valid extended transaction.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from chain.block import bits_to_target, merkle_root
from chain.hashes import sha256d
from chain.tx import COINBASE_PREV_TXID, COINBASE_PREV_VOUT, Tx, TxIn, TxOut, serialize, varint

P2PKH_PREFIX = bytes.fromhex("76a914")
P2PKH_SUFFIX = bytes.fromhex("88ac")


def p2pkh(h160: bytes) -> bytes:
    return P2PKH_PREFIX + h160 + P2PKH_SUFFIX


def build_tx(
    inputs: Sequence[TxIn],
    outputs: Sequence[TxOut] | Sequence[tuple[int, bytes]],
    version: int = 1,
    locktime: int = 0,
) -> Tx:
    outs = [o if isinstance(o, TxOut) else TxOut(o[0], o[1]) for o in outputs]
    return Tx(version, list(inputs), outs, locktime, serialize(version, inputs, outs, locktime))


def spend_input(prev: Tx, vout: int, script_sig: bytes = b"\x51") -> TxIn:
    """An input spending `prev`'s output `vout`, carrying that output (extended format)."""
    o = prev.outputs[vout]
    return TxIn(prev.txid, vout, script_sig, 0xFFFFFFFF, o.satoshis, o.script)


def coinbase_tx(height: int, outputs: Sequence[tuple[int, bytes]], tag: bytes = b"") -> Tx:
    """A coinbase whose script starts with the BIP34 height push."""
    h = height.to_bytes((height.bit_length() + 8) // 8 or 1, "little")
    script = bytes((len(h),)) + h + tag
    return build_tx([TxIn(COINBASE_PREV_TXID, COINBASE_PREV_VOUT, script, 0xFFFFFFFF)], outputs)


REGTEST_BITS = 0x207FFFFF  # the easiest target: about every other nonce meets it


def build_block(
    prev_hash: bytes,
    txs: Sequence[Tx],
    *,
    bits: int = REGTEST_BITS,
    timestamp: int = 1_700_000_000,
    version: int = 2,
) -> bytes:
    """A block's bytes: header (nonce ground until the hash meets `bits`) ‖ VarInt(n) ‖ txs.
    `prev_hash` is in internal byte order, as `Block.hash` is."""
    root = merkle_root([t.txid for t in txs])[0]
    target = bits_to_target(bits)
    head = struct.pack("<I32s32sII", version, prev_hash, root, timestamp, bits)
    for nonce in range(1 << 32):
        header = head + struct.pack("<I", nonce)
        if int.from_bytes(sha256d(header), "little") <= target:
            return header + varint(len(txs)) + b"".join(t.raw for t in txs)
    raise ValueError(f"no nonce meets bits {bits:#010x}")
