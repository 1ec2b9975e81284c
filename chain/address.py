"""Base58Check addresses → locking scripts (P2PKH and P2SH, mainnet and testnet).

Pure Python and small. Decoding verifies the 4-byte double-SHA-256 checksum; every failure is a
ValueError whose message names the problem (bad character and its position, bad checksum,
wrong length, unknown version byte).
"""

from __future__ import annotations

from chain.hashes import sha256d

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}

P2PKH_VERSIONS = {0x00: "mainnet", 0x6F: "testnet"}
P2SH_VERSIONS = {0x05: "mainnet", 0xC4: "testnet"}


def b58decode(s: str) -> bytes:
    """Base58 (Bitcoin alphabet) → bytes; each leading '1' is one leading zero byte."""
    n = 0
    for pos, c in enumerate(s):
        digit = _INDEX.get(c)
        if digit is None:
            raise ValueError(f"invalid base58 character {c!r} at position {pos}")
        n = n * 58 + digit
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    zeros = len(s) - len(s.lstrip("1"))
    return b"\x00" * zeros + body


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(ALPHABET[r])
    zeros = len(data) - len(data.lstrip(b"\x00"))
    return "1" * zeros + "".join(reversed(out))


def b58check_decode(s: str) -> bytes:
    """Base58Check → version byte ‖ payload, after verifying the checksum."""
    raw = b58decode(s)
    if len(raw) < 5:
        raise ValueError(f"base58check string too short ({len(raw)} bytes): {s!r}")
    data, checksum = raw[:-4], raw[-4:]
    if sha256d(data)[:4] != checksum:
        raise ValueError(f"bad base58check checksum in {s!r}")
    return data


def b58check_encode(data: bytes) -> str:
    return b58encode(data + sha256d(data)[:4])


def address_to_script(address: str) -> bytes:
    """A P2PKH or P2SH address (mainnet or testnet) → its locking script."""
    address = address.strip()
    if not address:
        raise ValueError("empty address")
    try:
        data = b58check_decode(address)
    except ValueError as e:
        raise ValueError(f"not a valid address: {e}") from None
    if len(data) != 21:
        raise ValueError(f"not a valid address: {len(data) - 1}-byte payload in {address!r} (expected 20)")
    version, h160 = data[0], data[1:]
    if version in P2PKH_VERSIONS:
        return b"\x76\xa9\x14" + h160 + b"\x88\xac"
    if version in P2SH_VERSIONS:
        return b"\xa9\x14" + h160 + b"\x87"
    raise ValueError(f"unsupported address version byte 0x{version:02x} in {address!r} (P2PKH or P2SH only)")


def script_to_address(script: bytes, testnet: bool = False) -> str | None:
    """The address of a P2PKH or P2SH locking script; None for any other script."""
    if len(script) == 25 and script[:3] == b"\x76\xa9\x14" and script[23:] == b"\x88\xac":
        return b58check_encode(bytes([0x6F if testnet else 0x00]) + script[3:23])
    if len(script) == 23 and script[:2] == b"\xa9\x14" and script[22:] == b"\x87":
        return b58check_encode(bytes([0xC4 if testnet else 0x05]) + script[2:22])
    return None
