"""Argument checks at the UTXO store's boundary: bad values become ProcessingError naming the
argument, before they can reach a database (where they would be a driver error, or worse, be
stored — a negative vout slices from the end of a Python bytes object)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeGuard

from stores.utxo.errors import ProcessingError

MAX_HEIGHT = (1 << 31) - 1  # heights are 32-bit INTEGER columns on PostgreSQL
MAX_ID = (1 << 63) - 1
MAX_VOUT = 0xFFFFFFFF


def _is_int(v: object) -> TypeGuard[int]:
    return type(v) is int  # bool is an int subclass; numpy ints and floats are not ints here


def height(name: str, v: object, *, zero_ok: bool = True) -> int:
    if not _is_int(v) or not (0 if zero_ok else 1) <= v <= MAX_HEIGHT:
        raise ProcessingError(f"{name} must be an integer height in 0…{MAX_HEIGHT}, got {v!r}")
    return v


def number(name: str, v: object, maximum: int = MAX_ID) -> int:
    if not _is_int(v) or not 0 <= v <= maximum:
        raise ProcessingError(f"{name} must be an integer in 0…{maximum}, got {v!r}")
    return v


def hash32(name: str, h: object) -> bytes:
    if not isinstance(h, bytes) or len(h) != 32:
        raise ProcessingError(f"{name} must be 32 bytes, got {h!r:.80}")
    return h


def outpoints(ops: Iterable[tuple[bytes, int]]) -> None:
    for txid, vout in ops:
        hash32("txid", txid)
        number("vout", vout, MAX_VOUT)


def txids(ids: Iterable[bytes]) -> None:
    # One pass with no call per item: set-mined checks every txid of every block.
    for t in [t for t in ids if type(t) is not bytes or len(t) != 32]:
        hash32("txid", t)
