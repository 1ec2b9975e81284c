"""Random block trees for the reorg tests, and the independent model they are checked against.

A tree starts from a UTXO snapshot (funding outputs, and a few coinbases that mature on chosen
heights) and grows a main branch and up to two more, each forking from the main branch at a
random depth. Every block is valid on its own branch: its transactions spend only outputs that
exist and are unspent on that branch, parents before children, a coinbase only once mature.
Branches are built each from its own view of the outputs, so they double-spend each other's;
some blocks mine again a transaction another branch mined (the same txid). The best chain is
the longest branch, and it is unique by construction.

The model knows nothing of the store: the confirmed set is computed from the best chain's
blocks alone, and so is the state every record on it must have.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from chain import Tx, TxIn, parse_block
from chain.build import build_tx, spend_input
from stores.state import StateStore
from stores.utxo import TxNotFound, UtxoStore
from tests.pipeline.chains import (
    SNAPSHOT_HASH,
    SNAPSHOT_HEIGHT,
    commitment_model,
    confirmed,
    confirmed_model,
    snapshot_utxos,
)
from workers.chainstate.commitment import muhash_hex
from workers.demo.demochain import Branch, tag_script

Outpoint = tuple[bytes, int]
FEE = 300
TREE_TAGS = 3_000_000_000  # a tree's first tag (coinbase tags are 4 bytes: well below 2^32)


@dataclass
class Tree:
    funds: list[Tx]  # snapshot records (not coinbases)
    coinbases: list[tuple[Tx, int]]  # snapshot coinbases and the height they were made at
    branches: list[Branch]  # branches[0] is the main one; the others fork from it
    forks: list[int]  # the index of the main block each branch follows (-1: the snapshot)
    best: int  # the index of the best (longest) branch
    arrival: list[bytes] = field(default_factory=list)  # raw blocks, in the order they arrive

    def snapshot(self) -> list:  # type: ignore[type-arg]
        return snapshot_utxos(self.funds, SNAPSHOT_HEIGHT) + [
            u for tx, h in self.coinbases for u in snapshot_utxos([tx], h, coinbase=True)
        ]

    def seed(self, utxo: UtxoStore) -> None:
        """Import the tree's snapshot into an empty store."""
        utxo.import_utxos(self.snapshot(), height=SNAPSHOT_HEIGHT, block_hash=SNAPSHOT_HASH)

    def parts(self, n: int = 3) -> list[list[bytes]]:
        """The arrival order cut into `n` consecutive parts (enqueued one after another)."""
        k = len(self.arrival)
        return [self.arrival[i * k // n : (i + 1) * k // n] for i in range(n)]

    @property
    def base(self) -> set[Outpoint]:
        return {(t.txid, v) for t in self.funds for v in range(len(t.outputs))} | {
            (t.txid, v) for t, _h in self.coinbases for v in range(len(t.outputs))
        }

    @property
    def best_blocks(self) -> list[list[Tx]]:
        return self.branches[self.best].txs

    def confirmed(self) -> set[Outpoint]:
        return confirmed_model(self.best_blocks, self.base)

    def tip(self) -> tuple[bytes, int]:
        b = self.branches[self.best]
        return parse_block(b.blocks[-1]).hash, b.height - 1


class Wallet:
    """What one branch may spend: outputs with their value and script, and coinbases with the
    height from which they may be spent."""

    def __init__(self) -> None:
        self.outs: dict[Outpoint, tuple[Tx, int]] = {}
        self.mature_at: dict[bytes, int] = {}

    def copy(self) -> Wallet:
        w = Wallet()
        w.outs, w.mature_at = dict(self.outs), dict(self.mature_at)
        return w

    def add(self, tx: Tx, mature_at: int = 0) -> None:
        for v in range(len(tx.outputs)):
            self.outs[(tx.txid, v)] = (tx, v)
        if mature_at:
            self.mature_at[tx.txid] = mature_at

    def spendable(self, height: int) -> list[Outpoint]:
        return sorted(op for op in self.outs if self.mature_at.get(op[0], 0) <= height)

    def spend(self, tx: Tx) -> None:
        for i in tx.inputs:
            del self.outs[(i.prev_txid, i.prev_vout)]
        self.add(tx)

    def can(self, tx: Tx, height: int) -> bool:
        return all(
            (i.prev_txid, i.prev_vout) in self.outs and self.mature_at.get(i.prev_txid, 0) <= height
            for i in tx.inputs
        )


def make_tree(seed: int, *, n_branches: int = 3, max_len: int = 6) -> Tree:
    """The tree of `seed`, the same whatever was generated before it in the process: its
    scripts and coinbase tags come from a counter of its own (a txid decides which outputs
    `grow` draws), above the numbers the shared counter reaches (every tree has fresh stores)."""
    rnd = random.Random(seed)
    tags = itertools.count(TREE_TAGS)

    def script() -> bytes:
        return tag_script(next(tags))

    funds = [build_tx([TxIn(next(tags).to_bytes(32, "big"), 0, b"\x51", 0xFFFFFFFF)],
                      [(10**8, script()), (10**8, script())]) for _ in range(8)]
    main_len = rnd.randint(3, max_len)
    # coinbases of the snapshot that mature exactly at a block of the main branch
    coinbases = []
    for _ in range(2):
        k = rnd.randint(1, main_len)  # block k (1-based) of the main branch spends it at maturity
        h = SNAPSHOT_HEIGHT + k - 100
        cb = build_tx([TxIn(b"\x00" * 32, 0xFFFFFFFF, next(tags).to_bytes(8, "big"), 0xFFFFFFFF)],
                      [(50 * 10**8, script())])
        coinbases.append((cb, h))
    genesis = Wallet()
    for t in funds:
        genesis.add(t)
    for cb, h in coinbases:
        genesis.add(cb, mature_at=h + 100)
    main = Branch(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1, tags=tags)
    mined: list[Tx] = []  # every non-coinbase tx of every branch so far (for re-mining)
    cur = genesis.copy()
    wallets = [cur.copy()]  # wallets[k]: what the main branch may spend after its k-th block
    for _ in range(main_len):
        grow(rnd, main, cur, mined, coinbase_at=[cb for cb, h in coinbases])
        wallets.append(cur.copy())
    branches, forks = [main], [-1]
    lengths = [main_len]
    for _b in range(rnd.randint(1, n_branches - 1)):
        at = rnd.randint(-1, main_len - 2)  # follows main block `at` (-1: the snapshot)
        side = Branch(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1, tags=tags) if at < 0 else main.fork(at)
        side.blocks, side.txs = [], []  # only its own blocks (the model adds main's before them)
        wallet = wallets[at + 1].copy()
        length = rnd.randint(1, max_len + 1)
        while (at + 1 + length) in lengths:  # a unique best: no two branches end at one height
            length += 1
        for _ in range(length):
            grow(rnd, side, wallet, mined, coinbase_at=[])
        branches.append(side)
        forks.append(at)
        lengths.append(at + 1 + length)
    best = max(range(len(branches)), key=lambda k: lengths[k])
    for k, b in enumerate(branches):  # each branch's txs as a whole chain, for the model
        if k and forks[k] >= 0:
            b.txs = main.txs[: forks[k] + 1] + b.txs
    tree = Tree(funds, coinbases, branches, forks, best)
    raws = [raw for b in branches for raw in b.blocks]
    raws += rnd.sample(raws, rnd.randint(0, 2))  # some delivered twice
    rnd.shuffle(raws)
    tree.arrival = raws
    return tree


def grow(rnd: random.Random, branch: Branch, wallet: Wallet, mined: list[Tx], coinbase_at: list[Tx]) -> None:
    """Add one block of 1-4 transactions to `branch`, spending from `wallet` (updated)."""
    height = branch.height
    txs: list[Tx] = []
    for cb in coinbase_at:  # a snapshot coinbase spent exactly at its maturity
        if wallet.mature_at.get(cb.txid) == height and (cb.txid, 0) in wallet.outs:
            out = (cb.outputs[0].satoshis - FEE, tag_script(next(branch.tags)))
            t = build_tx([spend_input(cb, 0)], [out])
            wallet.spend(t)
            txs.append(t)
    # mine again a tx another branch mined, when this branch can
    again = [t for t in mined if wallet.can(t, height) and t not in txs]
    if again and rnd.random() < 0.5:
        t = rnd.choice(again)
        wallet.spend(t)
        txs.append(t)
    for _ in range(rnd.randint(1, 3)):
        outs = wallet.spendable(height)
        if not outs:
            break
        picked = rnd.sample(outs, min(len(outs), rnd.randint(1, 2)))
        ins = [spend_input(*wallet.outs[op]) for op in picked]
        total = sum(wallet.outs[op][0].outputs[op[1]].satoshis for op in picked) - FEE
        n_out = rnd.randint(1, 2)
        t = build_tx(ins, [(total // n_out, tag_script(next(branch.tags))) for _ in range(n_out)])
        wallet.spend(t)
        txs.append(t)
    mined.extend(t for t in txs if t not in mined)
    branch.add(txs)


def check_store(tree: Tree, utxo: UtxoStore, state: StateStore) -> None:
    """The stores hold what a fresh store gets from the tree's best chain alone: its tip, the
    confirmed set, and every record of the best chain (mined in its block alone, not
    conflicting, its outputs spent by the best chain's spenders and by nothing else mined)."""
    tip = state.tip()
    want_hash, want_height = tree.tip()
    assert tip is not None and (tip.hash, tip.height) == (want_hash, want_height), (tip, want_height)
    assert confirmed(utxo) == tree.confirmed()
    made = state.get_commitment(tip.hash)  # the tip's, kept block by block through every reorg
    assert made is not None
    want = commitment_model(tree.best_blocks, SNAPSHOT_HEIGHT + 1, tree.snapshot())
    assert (muhash_hex(made), made.utxos, made.satoshis) == want
    spender: dict[tuple[bytes, int], bytes] = {}
    height_of: dict[bytes, int] = {}
    for k, txs in enumerate(tree.best_blocks):
        for t in txs:
            height_of[t.txid] = SNAPSHOT_HEIGHT + 1 + k
            if not t.is_coinbase:
                for i in t.inputs:
                    spender[(i.prev_txid, i.prev_vout)] = t.txid
    for txid, h in height_of.items():
        m = utxo.get(txid)
        assert not m.conflicting, txid[::-1].hex()
        assert list(m.block_heights) == [h] and m.unmined_since is None, (txid[::-1].hex(), m)
    outs = [(t.txid, v) for txs in tree.best_blocks for t in txs for v in range(len(t.outputs))]
    outs += sorted(tree.base)
    mined = utxo.mined(sorted({t for t in height_of}))
    for op, o in utxo.get_outputs(outs).items():
        if op in spender:
            assert o.spending_txid == spender[op], op
        else:  # unspent on the best chain: free, or held by a tx that is not mined
            assert o.spending_txid is None or o.spending_txid not in mined, op
    check_losers(tree, utxo, spender, set(height_of))


def check_losers(tree: Tree, utxo: UtxoStore, spender: dict[Outpoint, bytes], best: set[bytes]) -> None:
    """The transactions only losing branches mined, those the store holds: unmined; conflicting
    when they (or an ancestor) spend what the best chain spends otherwise or a coinbase only a
    losing block made; not conflicting, they hold their spends, conflicting, none. (Two
    losers that double-spend each other only: which one is conflicting depends on the order
    the branches were best in, so only "at most one holds the output" is checked.)"""
    losers: list[Tx] = []
    for b in tree.branches:
        for txs in b.txs:
            losers += [t for t in txs if t.txid not in best and t not in losers]
    dead_coinbases = {t.txid for t in losers if t.is_coinbase}
    must: set[bytes] = set()  # must be conflicting (parents come before children in `losers`)
    for t in losers:
        if not t.is_coinbase and any(
            spender.get((i.prev_txid, i.prev_vout), t.txid) != t.txid
            or i.prev_txid in must or i.prev_txid in dead_coinbases for i in t.inputs
        ):
            must.add(t.txid)
    for t in losers:
        try:
            m = utxo.get(t.txid)
        except TxNotFound:
            continue  # its branch was never the best: never applied
        name = t.txid[::-1].hex()
        assert list(m.block_heights) == [], (name, m)
        if t.txid in must:
            assert m.conflicting, f"{name} conflicts with the best chain but is not marked"
        if t.is_coinbase:
            continue
        held = utxo.get_outputs([(i.prev_txid, i.prev_vout) for i in t.inputs])
        holds = [o.spending_txid == t.txid for o in held.values()]
        if m.conflicting:
            assert not any(holds), f"{name} is conflicting but still holds spends"
        else:
            assert len(holds) == len(t.inputs) and all(holds), f"{name} is in the mempool without its spends"
