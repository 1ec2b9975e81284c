"""Generated chains: branches of blocks with valid regtest-easy proof of work, the chain `utxo demo`
applies, and an independent model of the confirmed UTXO set (the pipeline tests use them too).

Invariants:
- `generate` is deterministic: the same parameters give the same blocks, byte for byte (tags
  come from a counter of its own, timestamps from heights; no randomness, no clock).
- Every generated block is valid on its own branch: its proof of work meets REGTEST_BITS, its
  transactions spend only outputs that exist and are unspent on that branch (coinbases only
  when 100 blocks deep), and a parent comes before its child within a block.
- `confirmed_utxos` computes the confirmed set from the blocks alone, never from a store: it is
  what the store's confirmed view is checked against.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from chain import Tx, TxIn, is_data_carrier, sha256d
from chain.build import REGTEST_BITS, build_block, build_tx, coinbase_tx, p2pkh
from stores.utxo import Utxo

Outpoint = tuple[bytes, int]
SUBSIDY = 50 * 10**8
TAGS = itertools.count(1)  # the shared tag counter of Branch's default (tests); generate uses its own
SNAPSHOT_HEIGHT = 1000
SNAPSHOT_HASH = sha256d(b"utxoflow demo snapshot")  # the block the chain continues, known by hash only
FUNDING_HEIGHT = SNAPSHOT_HEIGHT - 200  # the funding coinbases matured long before the snapshot
FUNDING_COINBASES = 64
REORG_DEPTH = 2  # main blocks the heavier branch takes away (it brings one more)
FEE = 500
DUST = 546


def block_hash(raw: bytes) -> bytes:
    """A block's hash (internal byte order) from its header, without parsing its transactions."""
    return sha256d(raw[:80])


def tag_script(n: int) -> bytes:
    """A P2PKH script unique to tag `n` (its hash160 is the tag)."""
    return p2pkh(n.to_bytes(20, "big"))


@dataclass
class Branch:
    """A branch of generated blocks, each knowing its height and its parent's hash."""

    parent: bytes = b"\x00" * 32
    height: int = 1
    blocks: list[bytes] = field(default_factory=list)  # raw blocks
    txs: list[list[Tx]] = field(default_factory=list)
    tags: Iterator[int] = field(default=TAGS, repr=False, compare=False)

    def add(self, txs: list[Tx] | None = None, coinbase: Tx | None = None) -> bytes:
        body = [coinbase or self.coinbase(), *(txs or [])]
        raw = build_block(self.parent, body, timestamp=1_700_000_000 + self.height)
        self.blocks.append(raw)
        self.txs.append(body)
        self.parent = block_hash(raw)
        self.height += 1
        return raw

    def next_block(
        self, txs: list[Tx] | None = None, coinbase: Tx | None = None, *, bits: int = REGTEST_BITS
    ) -> bytes:
        """The bytes of a block that would follow this branch's last, without adding it (so a
        test can submit an invalid block and go on with the valid branch)."""
        return build_block(self.parent, [coinbase or self.coinbase(), *(txs or [])],
                           bits=bits, timestamp=1_700_000_000 + self.height)

    def coinbase(self, height: int | None = None) -> Tx:
        """A fresh coinbase (a new tag, so a new txid) for the next block, or for `height`."""
        h = self.height if height is None else height
        out = tag_script(next(self.tags))
        return coinbase_tx(h, [(SUBSIDY, out)], tag=next(self.tags).to_bytes(4, "big"))

    def fork(self, at: int) -> Branch:
        """A new branch whose next block follows block `at` (0-based index) of this one."""
        b = Branch(block_hash(self.blocks[at]), self.height - (len(self.blocks) - at - 1),
                   tags=self.tags)
        b.blocks, b.txs = list(self.blocks[: at + 1]), list(self.txs[: at + 1])
        return b


def confirmed_utxos(blocks: Iterable[Sequence[Tx]], base: Mapping[Outpoint, int]) -> dict[Outpoint, int]:
    """The confirmed UTXO set (outpoint → satoshis) that a chain of blocks leaves over the outputs
    `base` of a snapshot, computed without the store."""
    utxos = dict(base)
    for txs in blocks:
        for tx in txs:
            if not tx.is_coinbase:
                for i in tx.inputs:
                    utxos.pop((i.prev_txid, i.prev_vout), None)
            for v, o in enumerate(tx.outputs):
                if not is_data_carrier(o.satoshis, o.script):
                    utxos[(tx.txid, v)] = o.satoshis
    return utxos


# -- the demo's chain ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Coin:
    satoshis: int
    script: bytes


Wallet = OrderedDict[Outpoint, Coin]  # spendable outputs, oldest first


@dataclass
class DemoChain:
    snapshot: list[Utxo]  # what the store is seeded with, at SNAPSHOT_HEIGHT / SNAPSHOT_HASH
    main: list[bytes]  # the first branch, enqueued first: it continues the snapshot
    side: list[bytes]  # the heavier branch's own blocks, after the fork point
    best: list[list[Tx]]  # the transactions of the best chain, block by block
    big: Tx  # the multi-record transaction (more outputs than the batch size)
    records: int  # how many records it spans
    remined: Tx  # mined on both branches
    double_spent: Tx  # mined on the first branch only; its inputs are spent otherwise on the second
    replacement: Tx  # that other spend
    fork_height: int  # the last block both branches share
    expected: dict[Outpoint, int]  # the confirmed UTXO set at the end
    tip_hash: bytes
    tip_height: int
    n_txs: int  # transactions in every enqueued block, coinbases included

    @property
    def n_blocks(self) -> int:
        return len(self.main) + len(self.side)


class _Maker:
    """Transactions that spend a wallet's oldest coins, each paying FEE and splitting in two."""

    def __init__(self, tags: Iterator[int]) -> None:
        self.tags = tags

    def pay(self, wallet: Wallet, ins: list[tuple[Outpoint, Coin]], n_out: int = 2) -> Tx:
        """A transaction spending `ins` into `n_out` equal outputs, which join `wallet`."""
        total = sum(c.satoshis for _, c in ins) - FEE
        if total // n_out < DUST:
            n_out = 1  # deep in the chain the coins grow small: stop splitting
        each = total // n_out
        txins = [TxIn(op[0], op[1], b"\x51", 0xFFFFFFFF, c.satoshis, c.script) for op, c in ins]
        tx = build_tx(txins, [(each, tag_script(next(self.tags))) for _ in range(n_out)])
        for v, o in enumerate(tx.outputs):
            wallet[(tx.txid, v)] = Coin(o.satoshis, o.script)
        return tx

    def fill(self, wallet: Wallet, txs: list[Tx], n: int) -> list[Tx]:
        """`txs` topped up to `n` transactions: mostly spends of the oldest coins, and every
        fourth a child of the transaction before it, in the same block."""
        while len(txs) < n:
            prev = txs[-1] if txs else None
            child = prev is not None and len(txs) % 4 == 3 and (prev.txid, 0) in wallet
            if child:
                assert prev is not None
                ins = [((prev.txid, 0), wallet.pop((prev.txid, 0)))]
            else:
                ins = [wallet.popitem(last=False)]
            while sum(c.satoshis for _, c in ins) < FEE + DUST:
                ins.append(wallet.popitem(last=False))  # too small alone: gather another
            txs.append(self.pay(wallet, ins))
        return txs


def generate(blocks: int, txs_per_block: int, batch_size: int) -> DemoChain:
    """The demo's chain: `blocks` blocks on the first branch over a snapshot of mature coinbases,
    each with `txs_per_block` transactions besides its coinbase, among them a transaction of
    2.5 × `batch_size` outputs (block 1) spent on its first and last records (block 2); then a
    heavier branch forking REORG_DEPTH blocks below the first branch's tip, that mines one of the
    taken-away transactions again and spends the inputs of another otherwise."""
    if blocks < 3 or txs_per_block < 4:
        raise ValueError("the demo's chain needs at least 3 blocks of at least 4 transactions")
    tags = itertools.count(1)
    make = _Maker(tags)
    funding = [coinbase_tx(FUNDING_HEIGHT, [(SUBSIDY, tag_script(next(tags)))],
                           tag=next(tags).to_bytes(4, "big")) for _ in range(FUNDING_COINBASES)]
    snapshot = [Utxo(t.txid, 0, t.outputs[0].satoshis, t.outputs[0].script, FUNDING_HEIGHT, True)
                for t in funding]
    wallet: Wallet = OrderedDict(((u.txid, u.vout), Coin(u.satoshis, u.script)) for u in snapshot)
    main = Branch(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1, tags=tags)
    n_big = batch_size * 5 // 2
    fork_index = blocks - REORG_DEPTH - 1  # main.blocks[fork_index] is the last shared block
    at_fork: Wallet | None = None
    big = make.pay(wallet, [wallet.popitem(last=False)], n_big)
    # Kept aside for block 2, which spends the big one on its first record and on its last.
    ends = [(op, wallet.pop(op)) for op in ((big.txid, 0), (big.txid, n_big - 1))]
    for i in range(blocks):
        special = [big] if i == 0 else [make.pay(wallet, ends)] if i == 1 else []
        main.add(make.fill(wallet, special, txs_per_block))
        if i == fork_index:
            at_fork = wallet.copy()
    assert at_fork is not None
    fork_height = SNAPSHOT_HEIGHT + 1 + fork_index
    side = main.fork(fork_index)
    taken = main.txs[fork_index + 1 :]
    # Two transactions of the first block taken away whose inputs the side branch has too.
    movable = [t for t in taken[0][1:] if all((i.prev_txid, i.prev_vout) in at_fork for i in t.inputs)]
    remined, double_spent = movable[0], movable[1]
    # The side branch's other transactions spend coins the first branch left alone, so that
    # it conflicts with the first branch in the one transaction only.
    ins = [((i.prev_txid, i.prev_vout), at_fork[(i.prev_txid, i.prev_vout)]) for i in double_spent.inputs]
    replacement = make.pay(OrderedDict(), ins, 1)  # its output stays unspent
    side_wallet: Wallet = at_fork
    for t in (t for txs in taken for t in txs[1:]):
        for txin in t.inputs:
            side_wallet.pop((txin.prev_txid, txin.prev_vout), None)
    for k in range(REORG_DEPTH + 1):
        special = [remined, replacement] if k == 0 else []
        side.add(make.fill(side_wallet, special, txs_per_block))
    base = {(u.txid, u.vout): u.satoshis for u in snapshot}
    new_side = side.blocks[fork_index + 1 :]
    return DemoChain(
        snapshot=snapshot, main=main.blocks, side=new_side, best=side.txs, big=big,
        records=-(-n_big // batch_size), remined=remined, double_spent=double_spent,
        replacement=replacement, fork_height=fork_height,
        expected=confirmed_utxos(side.txs, base), tip_hash=side.parent, tip_height=side.height - 1,
        n_txs=sum(len(t) for t in main.txs) + sum(len(t) for t in side.txs[fork_index + 1 :]),
    )
