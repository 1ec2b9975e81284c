"""Hash helpers. Hashes are kept in internal byte order; only display reverses them."""

from __future__ import annotations

from hashlib import sha256


def sha256d(data: bytes | memoryview) -> bytes:
    """Bitcoin's double SHA-256."""
    return sha256(sha256(data).digest()).digest()


def hash_to_hex(h: bytes) -> str:
    """Internal-order hash → the byte-reversed hex Bitcoin shows."""
    return h[::-1].hex()


def hex_to_hash(s: str) -> bytes:
    """Displayed (byte-reversed) hex → internal-order 32 bytes. Raises ValueError naming the problem."""
    s = s.strip()
    if len(s) != 64:
        raise ValueError(f"a hash is 64 hex digits, got {len(s)}: {s[:80]!r}")
    try:
        return bytes.fromhex(s)[::-1]
    except ValueError:
        raise ValueError(f"not a hex hash: {s!r}") from None
