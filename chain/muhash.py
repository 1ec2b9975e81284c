"""MuHash3072: Bitcoin Core's order-free hash of a set (`gettxoutsetinfo ... muhash`).

Invariants:
- P is 2^3072 - 1103717. A set's state is one int in [1, P): the product, mod P, of the elements
  of what was inserted times the inverses of the elements of what was removed; 1 is the empty set.
  Core keeps a numerator and a denominator and divides once when it finalises; the quotient, and
  so the digest, is the same.
- `element(data)` is Core's ToNum3072: key = SHA-256(data) (single, no length prefix), then 384
  bytes of ChaCha20 keystream under that key with nonce 0 and block counter 0, read little-endian.
- `digest()` is SHA-256 of the reduced state as 384 little-endian bytes: Core's Finalize. `hex()`
  is that digest byte-reversed, the way Core prints a uint256 (and `gettxoutsetinfo` shows it).
- A coin's data (`coin_bytes`) is Core's TxOutSer: txid (32 bytes, internal order) ‖ vout (u32 LE)
  ‖ height*2 + coinbase (u32 LE) ‖ satoshis (i64 LE) ‖ CompactSize(len(script)) ‖ script.

`insert`/`remove` are the one statement of the set operations. `update` is their fast form for a
whole block: one running product for the created coins, one for the spent, a single inverse
(`update_elements` the same from elements kept; `elements` is `element`'s fast form: through
libcrypto with one re-keyed context where `chain.libcrypto` loads and agrees with `_keystream`,
else `_keystream`'s). A test holds them to `insert`/`remove` and `element`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import sha256

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from chain import libcrypto
from chain.tx import varint

try:  # GMP's multiplication: 3072-bit products about 3x faster than CPython's own
    from gmpy2 import mpz as _num
except ImportError:  # pragma: no cover - gmpy2 is a dependency; plain ints give the same values
    _num = int

_C = 1103717
P = (1 << 3072) - _C
_BITS = 3072
_MASK = (1 << _BITS) - 1
_SIZE = 384
_ZEROS = bytes(_SIZE)
# cryptography's ChaCha20 takes a 16-byte nonce: the 4-byte block counter (LE), then the 12-byte
# nonce. Core starts its keystream at counter 0 with a zero nonce.
_NONCE = bytes(16)
_coin_mid = struct.Struct("<IIq").pack  # vout, height*2 + coinbase, satoshis


def _keystream(data: bytes) -> bytes:
    """ChaCha20's first 384 bytes under the key SHA-256(`data`), nonce and counter 0."""
    return Cipher(algorithms.ChaCha20(sha256(data).digest(), _NONCE), None).encryptor().update(_ZEROS)


def element(data: bytes) -> int:
    """The Num3072 Core multiplies in for `data` (any length): < 2^3072, not reduced mod P (as in
    Core, where the arithmetic reduces it)."""
    return int.from_bytes(_keystream(data), "little")


_fast_keystreams = libcrypto.load(_keystream)


def coin_bytes(txid: bytes, vout: int, height: int, coinbase: bool, satoshis: int, script: bytes) -> bytes:
    """The bytes Core hashes into the UTXO set's MuHash for one unspent output."""
    if len(txid) != 32:
        raise ValueError(f"txid must be 32 bytes, got {len(txid)}")
    # struct refuses a vout or height code past u32 and satoshis past i64, as Core's types would.
    return txid + _coin_mid(vout, height * 2 + int(coinbase), satoshis) + varint(len(script)) + script


def elements(datas: Iterable[bytes]) -> list[int]:
    """`element` of each of `datas` (its fast form: this runs on every coin of every block),
    through libcrypto where it loaded, else `_keystream`'s. The numbers are GMP's where gmpy2
    is installed (`_product` multiplies them)."""
    fb = _num.from_bytes
    if _fast_keystreams is not None:
        datas = datas if isinstance(datas, list) else list(datas)
        try:
            return [fb(s, "little") for s in _fast_keystreams(datas)]
        except OSError:  # libcrypto failed a step (never seen): the plain form below answers
            pass
    return [fb(_keystream(d), "little") for d in datas]


def _product(nums: Iterable[int]) -> int:
    """The product of `nums` (each below 2^3072), congruent mod P, below 2^3072 + 2^44.

    Reduction folds the high half down (2^3072 = C mod P) instead of dividing: twice per coin,
    cheaper than one `%`. With a < 2^3072 + 2^44 and e < 2^3072, the first fold leaves fewer than
    3095 bits and the second puts a back under 2^3072 + 2^44, so the bound holds every step.
    """
    a = _num(1)
    bits, mask, c = _BITS, _num(_MASK), _num(_C)
    for e in nums:
        x = a * e
        x = (x >> bits) * c + (x & mask)
        a = (x >> bits) * c + (x & mask)
    return a


@dataclass(slots=True)
class MuHash:
    """A set's MuHash state: `value`, in [1, P), 1 for the empty set."""

    value: int = 1

    def insert(self, data: bytes) -> None:
        self.value = self.value * element(data) % P

    def remove(self, data: bytes) -> None:
        self.value = self.value * pow(element(data), -1, P) % P

    def update(self, created: Iterable[bytes], spent: Iterable[bytes]) -> None:
        """Insert every `created`, remove every `spent`: a block's coins in one step."""
        self.update_elements(elements(created), elements(spent))

    def update_elements(self, created: Iterable[int], spent: Iterable[int]) -> None:
        """`update` with the coins' `element`s given (a caller that kept them: a coin spent
        soon after it was made needs no hashing again)."""
        num = _product(created)
        den = _product(spent)
        if den != 1:
            num *= pow(den, -1, P)  # the one inverse (pow reduces den itself)
        self.value = int(self.value * num % P)

    def combine(self, other: MuHash) -> None:
        """Become the hash of the union of both sets (the product of the two states)."""
        self.value = self.value * other.value % P

    def to_bytes(self) -> bytes:
        """The state, 384 bytes little-endian: store it, and continue from it with `from_bytes`."""
        return self.value.to_bytes(_SIZE, "little")

    @classmethod
    def from_bytes(cls, b: bytes) -> MuHash:
        """The state `to_bytes` wrote. Any 384 bytes are accepted and reduced, as Core accepts a
        stored number at or above P."""
        if len(b) != _SIZE:
            raise ValueError(f"a MuHash state is {_SIZE} bytes, got {len(b)}")
        value = int.from_bytes(b, "little") % P
        if value == 0:
            raise ValueError("a MuHash state cannot be 0 mod P")
        return cls(value)

    def digest(self) -> bytes:
        """Core's Finalize: SHA-256 of the state, 32 bytes in internal order."""
        return sha256(self.value.to_bytes(_SIZE, "little")).digest()

    def hex(self) -> str:
        """The digest as Core prints it (byte-reversed), e.g. `gettxoutsetinfo`'s `muhash`."""
        return self.digest()[::-1].hex()
