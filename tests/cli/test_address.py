"""chain.address: Base58Check addresses → locking scripts, checked against an encoder written
here independently and against a published vector."""

from __future__ import annotations

import hashlib

import pytest

from chain.address import address_to_script, b58check_decode, script_to_address

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def encode_check(payload: bytes) -> str:
    """Base58Check by long division over the byte string (a different route than chain.address)."""
    data = payload + hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    digits = list(data)
    out = ""
    while any(digits):
        rem = 0
        for i, d in enumerate(digits):
            digits[i], rem = divmod(rem * 256 + d, 58)
        out = B58[rem] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def test_independent_encoder_matches_the_genesis_address() -> None:
    # The genesis coinbase pays 1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa, hash160 62e907b1….
    h160 = bytes.fromhex("62e907b15cbf27d5425399ebf6f0fb50ebb88f18")
    assert encode_check(b"\x00" + h160) == "1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa"


@pytest.mark.parametrize(
    ("version", "script_of"),
    [
        (0x00, lambda h: "76a914" + h + "88ac"),
        (0x6F, lambda h: "76a914" + h + "88ac"),
        (0x05, lambda h: "a914" + h + "87"),
        (0xC4, lambda h: "a914" + h + "87"),
    ],
)
def test_address_to_script(version: int, script_of: object) -> None:
    h = "62e907b15cbf27d5425399ebf6f0fb50ebb88f18"
    addr = encode_check(bytes([version]) + bytes.fromhex(h))
    assert callable(script_of)
    assert address_to_script(addr).hex() == script_of(h)
    assert script_to_address(address_to_script(addr), testnet=version in (0x6F, 0xC4)) == addr


def test_genesis_address() -> None:
    assert address_to_script("1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa").hex() == (
        "76a91462e907b15cbf27d5425399ebf6f0fb50ebb88f1888ac"
    )
    assert b58check_decode("1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa")[0] == 0


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNb", "checksum"),
        ("1A1zP1eP5QGefi2DMPTfTL5SLmv7Divf0a", "character '0'"),
        ("1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfIa", "character 'I'"),
        ("", "empty"),
        ("1111", "too short"),
    ],
)
def test_bad_addresses_name_the_problem(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        address_to_script(address)


def test_unsupported_version_and_length() -> None:
    h160 = bytes(20)
    with pytest.raises(ValueError, match="version byte 0x80"):
        address_to_script(encode_check(b"\x80" + h160))
    with pytest.raises(ValueError, match="19-byte payload"):
        address_to_script(encode_check(b"\x00" + h160[:19]))
