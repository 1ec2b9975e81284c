"""Building transactions from parts: for generated chains, tests and benchmarks.

`build_tx` returns a parsed-equivalent `Tx` (raw is the standard serialization) whose inputs
keep the previous outputs they were given, so it is also a valid extended transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from chain.tx import COINBASE_PREV_TXID, COINBASE_PREV_VOUT, Tx, TxIn, TxOut, serialize

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
