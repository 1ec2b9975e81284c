"""MuHash3072 against Bitcoin Core's own vectors, its set algebra, and the coin serialisation.

Vectors (Bitcoin Core):
- src/test/crypto_tests.cpp, muhash_tests: FromInt(i) is 32 bytes, i then zeros. FromInt(0) *
  FromInt(1) / FromInt(2) finalises to 10d312b1… (a uint256 literal: display order, reversed).
  FromInt(1) * FromInt(2) serialises (numerator ‖ denominator) to 1fa09329… ‖ 01 00…; the
  numerator is checked here. A stored numerator of 384 0xff bytes (2^3072 - 1, above P) over a
  denominator of 1 finalises to 3a31e690… (printed with HexStr: internal order, not reversed).
- test/functional/test_framework/crypto/muhash.py, its self-test: insert 00…, 01 00…, remove
  02 00…, and compare finalized[::-1].hex() with the same 10d312b1….
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import struct
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chain import Block, hex_to_hash, libcrypto, muhash
from chain.muhash import MuHash, P, coin_bytes, element, elements

CORE_DIGEST = "10d312b100cbd32ada024a6646e40d3482fcff103668d2625f10002a607d5863"
CORE_SER_NUMERATOR = (
    "1fa093295ea30a6a3acdc7b3f770fa538eff537528e990e2910e40bbcfd7f6696b1256901929094694b56316de342f59"
    "3303dd12ac43e06dce1be1ff8301c845beb15468fff0ef002dbf80c29f26e6452bccc91b5cb9437ad410d2a67ea84788"
    "7fa3c6a6553309946880fe20db2c73fe0641adbd4e86edfee0d9f8cd0ee1230898873dc13ed8ddcaf045c80faa082774"
    "279007a2253f8922ee3ef361d378a6af3ddaf180b190ac97e556888c36b3d1fb1c85aab9ccd46e3deaeb7b7cf5db067a"
    "7e9ff86b658cf3acd6662bbcce37232daa753c48b794356c020090c831a8304416e2aa7ad633c0ddb2f11be1be316a81"
    "be7f7e472071c042cb68faef549c221ebff209273638b741aba5a81675c45a5fa92fea4ca821d7a324cb1e1a2ccd3b76"
    "c4228ec8066dad2a5df6e1bd0de45c7dd5de8070bdb46db6c554cf9aefc9b7b2bbf9f75b1864d9f95005314593905c01"
    "09b71f703d49944ae94477b51dac10a816bb6d1c700bafabc8bd86fac8df24be519a2f2836b16392e18036cb13e48c5c"
)
CORE_OVERFLOW_DIGEST = "3a31e6903aff0de9f62f9a9f7f8b861de76ce2cda09822b90014319ae5dc2271"

# Mainnet block 1's coinbase: its one output, 50 BTC to a P2PK script.
BLOCK1_TXID = "0e3e2357e806b6cdb1f70b54c3a3a17b6714ee1f0e68bebb44a74b1efd512098"
BLOCK1_SCRIPT = (
    "410496b538e853519c726a2c91e61ec11600ae1390813a627c66fb8be7947be63c52da7589379515d4e0a604f8141781"
    "e62294721166bf621e73a82cbf2342c858eeac"
)


def from_int(i: int) -> bytes:
    """Core's test helper FromInt: 32 bytes, `i` then zeros."""
    return bytes((i,)) + bytes(31)


def test_modulus() -> None:
    assert P == 2**3072 - 1103717
    assert P.bit_length() == 3072
    assert pow(2, P - 1, P) == 1  # a Fermat witness: consistent with P being prime


def test_core_insert_remove_vector() -> None:
    m = MuHash()
    m.insert(from_int(0))
    m.insert(from_int(1))
    m.remove(from_int(2))
    assert m.hex() == CORE_DIGEST
    assert m.digest() == bytes.fromhex(CORE_DIGEST)[::-1]


def test_core_combine_vector() -> None:
    # acc = FromInt(0); acc *= FromInt(1); acc /= FromInt(2)
    acc, one = MuHash(), MuHash()
    acc.insert(from_int(0))
    one.insert(from_int(1))
    acc.combine(one)
    acc.remove(from_int(2))
    assert acc.hex() == CORE_DIGEST


def test_core_update_vector() -> None:
    m = MuHash()
    m.update([from_int(0), from_int(1)], [from_int(2)])
    assert m.hex() == CORE_DIGEST


def test_core_serialisation_vector() -> None:
    m = MuHash()
    m.insert(from_int(1))
    m.insert(from_int(2))
    assert m.to_bytes().hex() == CORE_SER_NUMERATOR
    assert m.value == element(from_int(1)) * element(from_int(2)) % P


def test_core_overflow_vector() -> None:
    m = MuHash.from_bytes(b"\xff" * 384)
    assert m.value == 2**3072 - 1 - P  # reduced on the way in
    assert m.digest().hex() == CORE_OVERFLOW_DIGEST  # HexStr: not reversed


def test_element_basics() -> None:
    e = element(b"")
    assert 0 < e < 2**3072
    assert element(from_int(0)) != element(from_int(1))
    assert element(b"x" * 1000) == element(b"x" * 1000)


def test_empty_set() -> None:
    m = MuHash()
    assert m.value == 1
    assert m.to_bytes() == b"\x01" + bytes(383)
    m.insert(b"a coin")
    assert m != MuHash()
    m.remove(b"a coin")
    assert m == MuHash()
    m.update([b"x", b"y"], [b"y", b"x"])
    assert m == MuHash()
    m.update([], [])
    assert m == MuHash()


def test_order_does_not_matter() -> None:
    # Core's loop: four operations on FromInt(0..3), each an insert or a remove, in four orders.
    rng = random.Random(3072)
    for _ in range(10):
        table = [rng.randrange(8) for _ in range(4)]
        digests = set()
        for order in range(4):
            m = MuHash()
            for i in range(4):
                t = table[i ^ order]
                (m.remove if t & 4 else m.insert)(from_int(t & 3))
            digests.add(m.digest())
        assert len(digests) == 1
        # x * y / (y * x) is the empty set
        x, y = from_int(rng.randrange(16)), from_int(rng.randrange(16))
        z, zy = MuHash(), MuHash()
        z.insert(x)
        zy.insert(y)
        z.combine(zy)
        z.remove(y)
        z.remove(x)
        assert z.digest() == MuHash().digest()


_datas = st.lists(st.binary(max_size=120), max_size=12)


@settings(max_examples=60, deadline=None)
@given(start=_datas, created=_datas, spent=_datas)
def test_update_equals_insert_remove(start: list[bytes], created: list[bytes], spent: list[bytes]) -> None:
    fast, slow = MuHash(), MuHash()
    for d in start:
        fast.insert(d)
        slow.insert(d)
    fast.update(iter(created), (d for d in spent + created[:1]))  # any iterables; overlap too
    for d in created:
        slow.insert(d)
    for d in spent + created[:1]:
        slow.remove(d)
    assert fast == slow
    assert 0 < fast.value < P


@settings(max_examples=30, deadline=None)
@given(datas=_datas)
def test_bytes_round_trip(datas: list[bytes]) -> None:
    m = MuHash()
    m.update(datas, [])
    b = m.to_bytes()
    assert len(b) == 384
    again = MuHash.from_bytes(b)
    assert again == m
    assert again.hex() == m.hex()
    # Continue from the stored state: the same as having gone on with the original.
    again.insert(b"next")
    m.insert(b"next")
    assert again == m


def test_from_bytes_refuses() -> None:
    with pytest.raises(ValueError):
        MuHash.from_bytes(bytes(383))
    with pytest.raises(ValueError):
        MuHash.from_bytes(bytes(384))
    with pytest.raises(ValueError):
        MuHash.from_bytes(P.to_bytes(384, "little"))


def test_coin_bytes_layout() -> None:
    txid = hex_to_hash(BLOCK1_TXID)  # internal order: the display hex reversed
    script = bytes.fromhex(BLOCK1_SCRIPT)
    got = coin_bytes(txid, 0, 1, True, 5_000_000_000, script)
    assert got[:32] == bytes.fromhex(BLOCK1_TXID)[::-1]
    assert got[32:36].hex() == "00000000"  # vout 0, u32 LE
    assert got[36:40].hex() == "03000000"  # height 1 * 2 + coinbase 1, u32 LE
    assert got[40:48].hex() == "00f2052a01000000"  # 5,000,000,000 satoshis, i64 LE
    assert got[48:49].hex() == "43"  # CompactSize(67)
    assert got[49:] == script
    assert len(got) == 32 + 4 + 4 + 8 + 1 + 67
    # A non-coinbase output at a large vout and height, with a script past 252 bytes.
    long_script = b"\x51" * 300
    got = coin_bytes(txid, 258, 500_000, False, 1, long_script)
    assert got[32:36].hex() == "02010000"
    assert got[36:40].hex() == "40420f00"  # 1,000,000
    assert got[40:48].hex() == "0100000000000000"
    assert got[48:51].hex() == "fd2c01"  # CompactSize(300)
    assert got[51:] == long_script


def test_coin_bytes_refuses() -> None:
    with pytest.raises(ValueError):
        coin_bytes(bytes(31), 0, 1, True, 1, b"")
    with pytest.raises(struct.error):  # no u32 holds the vout
        coin_bytes(bytes(32), 2**32, 1, True, 1, b"")


def test_block1_coinbase_matches_the_vector(blocks_1_255: list[Block]) -> None:
    tx = blocks_1_255[0].txs[0]
    (out,) = tx.outputs
    assert tx.txid == hex_to_hash(BLOCK1_TXID)
    assert (out.satoshis, out.script.hex()) == (5_000_000_000, BLOCK1_SCRIPT)


def test_bench_prints_json_last(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.muhash import main

    assert main(["--created", "20", "--spent", "10", "--repeat", "1"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["coins"] == 30
    assert {"us_per_coin", "ms_per_2000_tx_block"} <= r.keys()


@settings(max_examples=40, deadline=None)
@given(created=_datas, spent=_datas)
def test_elements_and_update_elements_are_the_plain_forms(created: list[bytes], spent: list[bytes]) -> None:
    assert [int(e) for e in elements(created)] == [element(d) for d in created]
    by_bytes, by_elements = MuHash(), MuHash()
    by_bytes.update(created, spent)
    by_elements.update_elements([element(d) for d in created], elements(spent))
    assert by_bytes == by_elements


def _libcrypto_here() -> bool:
    for name in ("libcrypto.so.3", "libcrypto.so.1.1"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def test_the_fast_form_is_used_where_libcrypto_is() -> None:
    # Where the library can be loaded on Linux, `elements` must be on the fast path: a failure to
    # bind it would otherwise only show as a slower pipeline.
    expected = sys.platform.startswith("linux") and _libcrypto_here()
    assert (muhash._fast_keystreams is not None) == expected


@settings(max_examples=20, deadline=None)
@given(datas=_datas)
def test_the_plain_form_without_libcrypto(datas: list[bytes]) -> None:
    fast = muhash._fast_keystreams
    muhash._fast_keystreams = None
    try:
        plain = elements(datas)
    finally:
        muhash._fast_keystreams = fast
    assert [int(e) for e in plain] == [element(d) for d in datas] == [int(e) for e in elements(datas)]


def test_a_libcrypto_that_disagrees_is_not_used() -> None:
    assert libcrypto.load(lambda d: bytes(384)) is None
    if muhash._fast_keystreams is not None:
        assert libcrypto.load(muhash._keystream) is not None


def test_threads_each_hash_with_their_own_context() -> None:
    rng = random.Random(7)
    work = [[rng.randbytes(rng.randrange(0, 300)) for _ in range(400)] for _ in range(4)]
    got: dict[int, list[int]] = {}

    def run(k: int) -> None:
        got[k] = [int(e) for e in elements(work[k])]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[k] for k in range(4)] == [[element(d) for d in w] for w in work]


def test_a_forked_child_hashes_as_its_parent() -> None:
    # Celery's prefork children inherit the parent's libcrypto context and buffers.
    datas = [bytes([k]) * k for k in range(40)]
    want = [element(d) for d in datas]
    assert [int(e) for e in elements(datas)] == want  # the parent's context exists now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            ok = [int(e) for e in elements(datas)] == want
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"1"
