"""Blocks the sequencer must refuse whole (CONTRACT "Chain rules"), on every backend: each is
`invalid` with a reason naming the problem, the tip stays, nothing of it is left in the UTXO
store, its descendants are invalid too, and the valid chain goes on past it."""

from __future__ import annotations

import struct
import time
import types
from collections.abc import Callable, Iterator

import pytest

from chain import TxIn, bits_to_target, parse_block, sha256d, utxo_hash
from chain.build import build_block, build_tx
from stores.state import BlockStatus
from tests.pipeline.chains import Chain, assemble, confirmed, funding, script, spend
from tests.pipeline.world import World
from workers.chainstate.sequencer import Sequencer


@pytest.fixture
def w(seq: Sequencer) -> World:
    return World(seq)


def patch_header(raw: bytes, *, bits: int | None = None, nonce: int | None = None) -> bytes:
    b = bytearray(raw)
    if bits is not None:
        b[72:76] = struct.pack("<I", bits)
    if nonce is not None:
        b[76:80] = struct.pack("<I", nonce)
    return bytes(b)


def pow_ok(raw: bytes) -> bool:
    return int.from_bytes(sha256d(raw[:80]), "little") <= bits_to_target(struct.unpack("<I", raw[72:76])[0])


def missing(txid: bytes = b"\x77" * 32, vout: int = 0) -> TxIn:
    return TxIn(txid, vout, b"\x51", 0xFFFFFFFF)


# -- refused on its own (before any transaction is applied) ----------------------------------


def test_proof_of_work_that_misses_a_hard_target(w: World) -> None:
    raw = patch_header(w.chain.next_block([spend((w.funds[1], 0))]), bits=0x1D00FFFF)
    assert not pow_ok(raw)
    w.refused(raw, r"proof of work")


def test_proof_of_work_whose_nonce_misses_its_own_easy_target(w: World) -> None:
    raw = w.chain.next_block([spend((w.funds[1], 0))])
    nonce = struct.unpack("<I", raw[76:80])[0]
    while pow_ok(raw):  # about every other nonce misses the regtest target
        nonce += 1
        raw = patch_header(raw, nonce=nonce)
    w.refused(raw, r"proof of work")


def test_bits_of_a_zero_target(w: World) -> None:
    w.refused(patch_header(w.chain.next_block([spend((w.funds[1], 0))]), bits=0x00000000), r"proof of work")


NO_TARGET = pytest.mark.parametrize("bits", [0x01FEDCBA, 0xFF7FFFFF], ids=["negative", "overflow"])


@NO_TARGET
def test_bits_that_encode_no_target(w: World, bits: int) -> None:
    w.refused(patch_header(w.chain.next_block([spend((w.funds[1], 0))]), bits=bits), r"proof of work")


@NO_TARGET
def test_a_first_block_whose_bits_encode_no_target(seq: Sequencer, bits: int) -> None:
    raw = patch_header(Chain().next_block(), bits=bits)
    e = seq.accept(seq.store_block(raw))  # (not submit: with nothing applied it would wait)
    assert e is not None and e.status is BlockStatus.INVALID and "proof of work" in (e.reason or "")
    assert seq.advance() is None and seq.utxo.is_empty()


def test_merkle_root_that_does_not_match(w: World) -> None:
    good = w.chain.next_block([spend((w.funds[1], 0)), spend((w.funds[2], 0))])
    bad = good[:-1] + bytes([good[-1] ^ 1])  # the last tx's locktime: another txid
    assert parse_block(bad).hash == parse_block(good).hash
    w.refused(bad, r"merkle root does not match")


def test_merkle_root_of_one_changed_byte_inside_a_transaction(w: World) -> None:
    a = spend((w.funds[1], 0))
    good = w.chain.next_block([a])
    at = good.index(a.outputs[0].script)  # a byte of the output's script: still parses
    bad = bytearray(good)
    bad[at + 5] ^= 0xFF
    w.refused(bytes(bad), r"merkle root does not match")


@pytest.mark.parametrize("n_txs", [3, 6], ids=["last-tx-repeated", "last-pair-repeated"])
def test_merkle_mutation_of_a_duplicated_last_pair(w: World, n_txs: int) -> None:
    """CVE-2012-2459: repeating the tail that the merkle tree duplicates keeps the root."""
    raw = w.chain.next_block([spend((w.funds[i], 0)) for i in range(1, n_txs)])
    txs = parse_block(raw).txs
    extra = txs[-1:] if len(txs) % 2 else txs[-2:]
    mutated = assemble(raw[:80], [*txs, *extra])
    assert parse_block(mutated).computed_merkle_root() == (parse_block(raw).header.merkle_root, True)
    w.refused(mutated, r"mutation|duplicated")


def test_a_repeated_txid(w: World) -> None:
    a, b = spend((w.funds[1], 0)), spend((w.funds[2], 0))
    raw = w.chain.next_block([a, b, a])  # not the last pair: no merkle mutation
    assert not parse_block(raw).computed_merkle_root()[1]
    w.refused(raw, r"repeats tx " + a.txid_hex)


def test_a_second_coinbase(w: World) -> None:
    cb2 = w.chain.coinbase()
    w.refused(w.chain.next_block([spend((w.funds[1], 0)), cb2]), r"second coinbase")


def test_a_first_transaction_that_is_not_a_coinbase(w: World) -> None:
    raw = build_block(w.chain.parent, [spend((w.funds[1], 0))], timestamp=1_700_000_000 + w.chain.height)
    w.refused(raw, r"not a coinbase")


# -- refused when applied ----------------------------------------------------------------------


def test_a_transaction_spending_an_output_whose_tx_is_unknown(w: World) -> None:
    a = spend((w.funds[1], 0))  # applied first, then taken back
    b = build_tx([spend((w.funds[2], 0)).inputs[0], missing()], [(10**8, script())])
    w.refused(w.chain.next_block([a, b]), r"missing output")


def test_a_transaction_spending_an_output_past_its_parent_s_last(w: World) -> None:
    a = spend((w.funds[1], 0))
    b = build_tx([missing(w.mined.txid, 2)], [(10**7, script())])  # `mined` has outputs 0 and 1
    w.refused(w.chain.next_block([a, b]), r"missing output")


def test_a_transaction_spending_a_data_carrier(w: World) -> None:
    d = build_tx([spend((w.funds[1], 0)).inputs[0]], [(10**7, script()), (0, b"\x00\x6a\x04data")])
    w.add([d])
    a = spend((w.funds[2], 0))
    b = build_tx([missing(d.txid, 1)], [(1, script())])
    w.refused(w.chain.next_block([a, b]), r"missing output")


def test_a_transaction_spending_an_output_of_a_conflicting_transaction(w: World) -> None:
    m = spend((w.funds[1], 0))
    w.mempool(m)
    w.add([spend((w.funds[1], 0), fee=5)])  # m is conflicting now
    assert w.seq.utxo.get(m.txid, ["conflicting"]).conflicting
    w.refused(w.chain.next_block([spend((w.funds[2], 0)), spend((m, 0))]), r"conflicting", keep=[m.txid])


def test_a_transaction_spending_a_frozen_output(w: World) -> None:
    f = w.funds[1]
    o = f.outputs[0]
    assert w.seq.utxo.freeze([((f.txid, 0), utxo_hash(f.txid, 0, o.script, o.satoshis))]) == [None]
    w.refused(w.chain.next_block([spend((w.funds[2], 0)), spend((f, 0))]), r"frozen", go_on=False)


def test_a_transaction_without_outputs(w: World) -> None:
    empty = build_tx([spend((w.funds[2], 0)).inputs[0]], [])
    w.refused(w.chain.next_block([spend((w.funds[1], 0)), empty]), r"no outputs")


@pytest.mark.parametrize("how", ["two-txs", "one-tx-twice"])
def test_a_double_spend_within_the_block(w: World, how: str) -> None:
    a = spend((w.funds[1], 0))
    if how == "two-txs":
        txs = [a, spend((w.funds[1], 0), fee=2000)]
    else:
        txs = [a, build_tx([a.inputs[0], spend((w.funds[2], 0)).inputs[0], a.inputs[0]], [(10**8, script())])]
    w.refused(w.chain.next_block(txs), r"double spend within the block")


def test_a_double_spend_of_an_output_spent_in_an_earlier_block(w: World) -> None:
    w.add([spend((w.funds[1], 0))])  # `mined` spent funds[0] a block earlier
    a = spend((w.funds[2], 0))
    again = spend((w.funds[0], 0), fee=5000)
    w.refused(w.chain.next_block([a, again]), r"already spent on this chain")
    w.unspent([(w.mined.txid, 0), (w.mined.txid, 1)])
    assert w.seq.utxo.get_output((w.funds[0].txid, 0)).spending_txid == w.mined.txid  # type: ignore[union-attr]


def test_a_coinbase_spent_99_blocks_deep_then_100(w: World) -> None:
    cb = w.chain.txs[0][0]  # block 1001's coinbase
    for _ in range(98):
        w.seq.submit(w.chain.add())
    assert w.chain.height == 1001 + 99
    w.refused(w.chain.next_block([spend((w.funds[1], 0)), spend((cb, 0))]), r"immature coinbase",
              go_on=False)
    w.add([spend((w.funds[1], 0))])
    w.add([spend((cb, 0))])  # 100 blocks deep
    assert w.seq.state.tip().height == 1001 + 100  # type: ignore[union-attr]


def test_a_snapshot_coinbase_spent_99_blocks_deep_then_100(seq: Sequencer) -> None:
    cbf = funding(1)
    w = World(seq, coinbase_funds=cbf, coinbase_height=1003 - 100)  # spendable from 1003
    w.refused(w.chain.next_block([spend((w.funds[1], 0)), spend((cbf[0], 0))]), r"immature coinbase",
              go_on=False)
    w.add([spend((w.funds[1], 0))])
    assert w.chain.height == 1003
    w.add([spend((cbf[0], 0))])


# -- the invalid block's family ----------------------------------------------------------------


def _bad_pow(w: World) -> bytes:
    return patch_header(w.chain.next_block([spend((w.funds[1], 0))]), bits=0x1D00FFFF)


def _bad_spend(w: World) -> bytes:
    return w.chain.next_block([spend((w.funds[0], 0), fee=7)])  # already spent on this chain


@pytest.mark.parametrize("make", [_bad_pow, _bad_spend], ids=["on-its-own", "when-applied"])
def test_a_child_of_an_invalid_block_is_invalid(w: World, make: Callable[[World], bytes]) -> None:
    bad_raw = make(w)
    bad = w.seq.submit(bad_raw)
    assert bad.status is BlockStatus.INVALID
    kid = Chain(bad.hash, w.chain.height + 1)
    for _ in range(2):  # child and grandchild
        e = w.seq.submit(kid.add([spend((w.funds[2], 0))] if not kid.blocks else None))
        assert e.status is BlockStatus.INVALID and e.reason == "its parent is invalid", e
        assert e.height == kid.height - 1
    w.check()
    assert not w.seq.utxo.existing([t.txid for txs in kid.txs for t in txs])
    w.unspent([(w.funds[2].txid, 0)])
    w.add([spend((w.funds[2], 0))])


def test_parent_and_child_indexed_before_the_parent_is_found_invalid(w: World) -> None:
    bad_raw = _bad_spend(w)
    bad = parse_block(bad_raw)
    kid = Chain(bad.hash, w.chain.height + 1)
    kid_raw = kid.add([spend((w.funds[2], 0))])
    for raw in (bad_raw, kid_raw):  # indexed, not applied yet
        e = w.seq.accept(w.seq.store_block(raw))
        assert e is not None and e.status is BlockStatus.PENDING
    tip = w.seq.advance()
    assert tip is not None and tip.hash == w.chain.parent
    b = w.seq.state.get_block(bad.hash)
    assert b is not None and b.status is BlockStatus.INVALID and "already spent" in (b.reason or "")
    k = w.seq.state.get_block(kid.parent)
    assert k is not None and k.status is BlockStatus.INVALID and k.reason == "its parent is invalid"
    w.check()
    assert not w.seq.utxo.existing([t.txid for txs in [*kid.txs, bad.txs] for t in txs])
    w.unspent([(w.funds[2].txid, 0)])


def test_an_orphan_whose_parent_arrives_and_is_refused_when_applied(w: World) -> None:
    bad_raw = _bad_spend(w)
    bad = parse_block(bad_raw)
    kid = Chain(bad.hash, w.chain.height + 1)
    e = w.seq.submit(kid.add())
    assert e.status is BlockStatus.ORPHAN and e.height is None
    w.refused(bad_raw, r"already spent on this chain")
    k = w.seq.state.get_block(kid.parent)
    assert k is not None and k.status is BlockStatus.INVALID


def test_an_orphan_whose_parent_arrives_invalid_on_its_own(w: World) -> None:
    bad_raw = _bad_pow(w)
    kid = Chain(parse_block(bad_raw).hash, w.chain.height + 1)
    assert w.seq.submit(kid.add()).status is BlockStatus.ORPHAN
    w.refused(bad_raw, r"proof of work")
    k = w.seq.state.get_block(kid.parent)
    assert k is not None and k.status is BlockStatus.INVALID


def test_a_valid_sibling_after_an_invalid_block(w: World) -> None:
    sibling_of = w.chain.height
    bad = w.seq.submit(_bad_spend(w))
    assert bad.status is BlockStatus.INVALID and bad.height == sibling_of
    e = w.add([spend((w.funds[3], 0))])
    assert e.height == sibling_of and e.parent == bad.parent
    w.add()
    assert w.seq.state.get_block(bad.hash).status is BlockStatus.INVALID  # type: ignore[union-attr]


def test_a_heavier_branch_with_an_invalid_block_leaves_the_chain_as_it_was(w: World) -> None:
    fork = w.chain.fork(len(w.chain.blocks) - 1)  # after block 1001
    w.add([spend((w.funds[1], 0))])
    w.add([spend((w.funds[2], 0))])
    side_tx = spend((w.funds[1], 0), fee=3000)  # conflicts with block 1002's
    fork.add([side_tx])
    fork.add([spend((w.funds[0], 0), fee=9)])  # already spent on both branches: invalid
    fork.add()
    for raw in fork.blocks[-3:]:
        w.seq.submit(raw)
    side = [w.seq.state.get_block(parse_block(r).hash) for r in fork.blocks[-3:]]
    assert [s.status for s in side] == [BlockStatus.SIDE, BlockStatus.INVALID, BlockStatus.INVALID]  # type: ignore[union-attr]
    w.check()  # back on the first branch
    assert w.seq.utxo.get(side_tx.txid, ["conflicting"]).conflicting
    assert not w.seq.utxo.get(w.chain.txs[1][1].txid, ["conflicting"]).conflicting


# -- bugs: what the rules ask and the sequencer does not do (yet) -------------------------------


@pytest.mark.parametrize("how", ["changed-byte", "duplicated-last-tx"])
def test_the_genuine_block_after_a_corrupted_copy_of_it(w: World, how: str) -> None:
    body = [spend((w.funds[1], 0)), spend((w.funds[2], 0))]
    good = w.chain.next_block(body)
    if how == "changed-byte":
        bad = good[:-1] + bytes([good[-1] ^ 1])
    else:
        blk = parse_block(good)
        bad = assemble(good[:80], [*blk.txs, blk.txs[-1]])
    assert parse_block(bad).hash == parse_block(good).hash
    assert w.seq.submit(bad).status is BlockStatus.INVALID
    w.chain.add(body)
    e = w.seq.submit(good)
    assert e.status is BlockStatus.APPLIED, e


def test_a_transaction_spending_an_output_of_an_unmined_transaction(w: World) -> None:
    m = spend((w.funds[1], 0))
    w.mempool(m)
    child = spend((m, 0))  # m is not in the block, nor on the chain
    w.refused(w.chain.next_block([spend((w.funds[2], 0)), child]), r"not mined on this chain", keep=[m.txid])


def test_a_transaction_mined_again_in_a_later_block(w: World) -> None:
    w.add()
    raw = w.chain.next_block([spend((w.funds[1], 0)), w.mined])  # `mined` is in block 1001
    w.refused(raw, r"already (spent|mined) on this chain", keep=[w.mined.txid])


def test_a_refused_block_leaves_the_mempool_transaction_it_conflicted_with(w: World) -> None:
    m = spend((w.funds[1], 0), (w.funds[2], 0))
    w.mempool(m)
    a = spend((w.funds[1], 0), fee=5)  # would make m conflicting...
    b = build_tx([missing()], [(1, script())])  # ...but the block is refused
    block = w.chain.next_block([a, b])
    entry = w.seq.submit(block)
    assert entry.status is BlockStatus.INVALID
    w.check()
    assert not w.seq.utxo.existing([a.txid, b.txid])
    assert not w.seq.utxo.get(m.txid, ["conflicting"]).conflicting
    outs = w.seq.utxo.get_outputs([(w.funds[1].txid, 0), (w.funds[2].txid, 0)])
    assert {o.spending_txid for o in outs.values()} == {m.txid}
    assert not any(w.seq.utxo.get(f.txid).locked for f in w.funds)  # the swap's locks are gone


def test_a_refused_block_that_includes_a_mempool_tx_leaves_its_age(w: World) -> None:
    """A mempool tx in a block refused before its mining keeps `unmined_since` (its age, which
    the pruner's preservation of old unmined txs goes by) and its other state."""
    m = spend((w.funds[1], 0))
    w.mempool(m)
    since = w.seq.utxo.get(m.txid).unmined_since
    assert since is not None
    w.add([spend((w.funds[3], 0))])  # the chain moves on
    bad = w.chain.next_block([m, build_tx([missing()], [(1, script())])])
    assert w.seq.submit(bad).status is BlockStatus.INVALID
    meta = w.seq.utxo.get(m.txid)
    assert meta.unmined_since == since and meta.block_ids == [] and not meta.conflicting


@pytest.fixture
def no_spin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`submit` sleeps while another worker holds a lease; in these tests no other worker exists,
    so a sleep is a wait for ever: fail it at once."""
    import workers.chainstate.sequencer as mod

    def sleep(_s: float) -> None:
        raise AssertionError("Sequencer.submit waits for a lease nobody holds")

    fake = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    fake.sleep = sleep
    monkeypatch.setattr(mod, "time", fake)
    yield


def test_an_invalid_first_block_through_submit(seq: Sequencer, no_spin: None) -> None:
    e = seq.submit(patch_header(Chain().next_block(), bits=0x1D00FFFF))
    assert e.status is BlockStatus.INVALID


def test_a_valid_first_block_after_an_invalid_one(seq: Sequencer) -> None:
    c = Chain()
    bad = seq.accept(seq.store_block(patch_header(c.next_block(), bits=0x1D00FFFF)))
    assert bad is not None and bad.status is BlockStatus.INVALID
    c.add()
    good = seq.accept(seq.store_block(c.blocks[0]))
    assert good is not None and good.status is BlockStatus.PENDING and good.height == 1, good
    tip = seq.advance()
    assert tip is not None and tip.hash == c.parent and tip.height == 1
    assert confirmed(seq.utxo) == {(c.txs[0][0].txid, 0)}


def test_a_block_replaying_a_pruned_tx_is_refused(w: World) -> None:
    """A tx mined long ago and pruned since (its parent lists it among its deleted children)
    cannot be mined again: the block replaying it is refused (INVALID_SPEND), and taking the
    block back leaves the old spend where it is."""
    t = spend((w.funds[1], 0))
    w.add([t])
    w.add([spend((t, 0))])  # t is mined and fully spent: due for pruning
    dah = w.seq.utxo.get(t.txid).delete_at_height
    assert dah is not None and w.seq.utxo.delete_expired([t.txid], dah) == 1
    assert w.seq.utxo.get(w.funds[1].txid).deleted_children == [t.txid]
    w.refused(w.chain.next_block([t]), r"INVALID_SPEND|was pruned")
    out = w.seq.utxo.get_output((w.funds[1].txid, 0))
    assert out is not None and out.spending_txid == t.txid  # still spent by the pruned t
