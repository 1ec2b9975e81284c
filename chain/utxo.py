"""What makes an output a UTXO, and its UTXO hash (CONTRACT "Chain rules").

- A zero-satoshi output whose script starts with OP_RETURN (`6a`) or OP_FALSE OP_RETURN (`006a`)
  is a data carrier: it never enters the UTXO set.
- The UTXO hash of an output is one SHA-256 over the txid (32 bytes, internal order), the output
  index as a Bitcoin VarInt, the locking script (no length prefix) and the satoshis as a VarInt.

`utxo_hash` is the one statement of the hash. Its fast forms, for the loops every block runs,
hash the same bytes in one call per transaction: `utxo_hashes` for its outputs (the data-carrier
test inlined), `spent_hashes` for the outputs its inputs spend (when an extended transaction
carries them). A test holds them to `utxo_hash`.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import sha256

from chain.tx import TxIn, TxOut, varint

# One-byte VarInts, prebuilt: almost every vout and many satoshi amounts are below 0xFD.
_ONE = [bytes((i,)) for i in range(0xFD)]


def is_data_carrier(satoshis: int, script: bytes) -> bool:
    """Zero-satoshi OP_RETURN / OP_FALSE OP_RETURN outputs never enter the UTXO set."""
    return satoshis == 0 and (script[:1] == b"\x6a" or script[:2] == b"\x00\x6a")


def utxo_hash(txid: bytes, vout: int, script: bytes, satoshis: int) -> bytes:
    """SHA-256 over txid (internal order) ‖ VarInt(vout) ‖ script ‖ VarInt(satoshis). (The
    satoshis' VarInt is written out here: every input of every block is hashed this way.)"""
    if satoshis < 0xFD:
        sb = _ONE[satoshis]
    elif satoshis > 0xFFFFFFFF:
        sb = b"\xff" + satoshis.to_bytes(8, "little")
    elif satoshis > 0xFFFF:
        sb = b"\xfe" + satoshis.to_bytes(4, "little")
    else:
        sb = b"\xfd" + satoshis.to_bytes(2, "little")
    return sha256(txid + (_ONE[vout] if vout < 0xFD else varint(vout)) + script + sb).digest()


def utxo_hashes(txid: bytes, outputs: Sequence[TxOut], start: int = 0) -> list[bytes | None]:
    """`utxo_hash` of each of `outputs` (output `start` first), None for a data carrier."""
    out: list[bytes | None] = []
    append = out.append
    one = _ONE
    for vout, o in enumerate(outputs, start):
        sats, script = o.satoshis, o.script
        if sats == 0 and (script[:1] == b"\x6a" or script[:2] == b"\x00\x6a"):
            append(None)
            continue
        if sats < 0xFD:
            sb = one[sats]
        elif sats > 0xFFFFFFFF:
            sb = b"\xff" + sats.to_bytes(8, "little")
        elif sats > 0xFFFF:
            sb = b"\xfe" + sats.to_bytes(4, "little")
        else:
            sb = b"\xfd" + sats.to_bytes(2, "little")
        append(sha256(txid + (one[vout] if vout < 0xFD else varint(vout)) + script + sb).digest())
    return out


def spent_hashes(inputs: Sequence[TxIn]) -> list[bytes | None]:
    """`utxo_hash` of the previous output each input spends, None where the input does not
    carry it (a standard-format transaction)."""
    out: list[bytes | None] = []
    append = out.append
    one = _ONE
    for i in inputs:
        sats, script = i.prev_satoshis, i.prev_script
        if sats is None or script is None:
            append(None)
            continue
        if sats < 0xFD:
            sb = one[sats]
        elif sats > 0xFFFFFFFF:
            sb = b"\xff" + sats.to_bytes(8, "little")
        elif sats > 0xFFFF:
            sb = b"\xfe" + sats.to_bytes(4, "little")
        else:
            sb = b"\xfd" + sats.to_bytes(2, "little")
        vout = i.prev_vout
        append(sha256(i.prev_txid + (one[vout] if vout < 0xFD else varint(vout)) + script + sb).digest())
    return out
