"""The packed UTXO slots of a record, as the data model defines them (Teranode's UTXO data model).

A record's `utxos` is a byte string of fixed 68-byte slots, slot i for output i of the page:
    [0:32]  UTXO hash (all zero: no slot — a data carrier, or an output a snapshot left out)
    [32:68] spending data: all zero → unspent; all 0xFF → frozen; else spending txid ‖ vin (LE u32)
Fixed width (unlike Aerospike's 32/68-byte list items) lets SQL backends index a slot by
arithmetic and rewrite it in place; the states and their meaning are the same.

Also here: the `.outputs`-style encoding of a record's outputs when no raw transaction is kept
(snapshot imports): VarInt(n) then, per output, VarInt(vout) ‖ u64 satoshis ‖ VarInt(len) ‖ script.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from chain.tx import varint

SLOT = 68
NO_HASH = b"\x00" * 32
UNSPENT = b"\x00" * 36
FROZEN = b"\xff" * 36
EMPTY_SLOT = b"\x00" * SLOT

_u64 = struct.Struct("<Q")


def is_live(utxos: bytes | bytearray, off: int) -> bool:
    """Whether the slot at byte offset `off` holds a UTXO that is not spent (unspent, or frozen:
    frozen is not spent) — what the unspent views list and the script index keeps. Hot loops
    test the same prefixes inline (`stores.utxo.view`)."""
    return not utxos.startswith(NO_HASH, off) and (
        utxos.startswith(UNSPENT, off + 32) or utxos.startswith(FROZEN, off + 32)
    )


def pack(hashes: Iterable[bytes | None]) -> bytes:
    """Slots for these UTXO hashes, unspent; None leaves a no-slot gap."""
    return b"".join(EMPTY_SLOT if h is None else h + UNSPENT for h in hashes)


def spending_data(txid: bytes, vin: int) -> bytes:
    return txid + vin.to_bytes(4, "little")


def decode(slot: bytes) -> tuple[bytes | None, bytes | None, int | None, bool]:
    """(utxo_hash or None, spending_txid, spending_vin, frozen) of one 68-byte slot."""
    h = slot[:32]
    if h == NO_HASH:
        return None, None, None, False
    spend = slot[32:]
    if spend == UNSPENT:
        return h, None, None, False
    if spend == FROZEN:
        return h, None, None, True
    return h, spend[:32], int.from_bytes(spend[32:], "little"), False


def encode_outputs(outputs: Iterable[tuple[int, int, bytes]]) -> bytes:
    items = list(outputs)
    parts = [varint(len(items))]
    for vout, sats, script in items:
        parts += [varint(vout), _u64.pack(sats), varint(len(script)), script]
    return b"".join(parts)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    n = buf[pos]
    if n < 0xFD:
        return n, pos + 1
    size = {0xFD: 2, 0xFE: 4, 0xFF: 8}[n]
    return int.from_bytes(buf[pos + 1 : pos + 1 + size], "little"), pos + 1 + size


def decode_outputs(blob: bytes) -> dict[int, tuple[int, bytes]]:
    n, pos = _varint(blob, 0)
    out: dict[int, tuple[int, bytes]] = {}
    for _ in range(n):
        vout, pos = _varint(blob, pos)
        sats = _u64.unpack_from(blob, pos)[0]
        slen, pos = _varint(blob, pos + 8)
        out[vout] = (sats, blob[pos : pos + slen])
        pos += slen
    return out
