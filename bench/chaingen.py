"""A chain from regtest's genesis whose spends reach across the whole UTXO set, with a model of
its confirmed set and commitment computed from the blocks alone (`bench.scaleout`'s chain).

Shape (`generate(main_blocks, txs_per_block, fan_blocks, seed)`):
- heights 1 … 100: a coinbase each (one 50-coin output), so the first ones mature;
- `fan_blocks` blocks (heights 101 …): each spends the coinbase that just matured into one
  transaction of `txs_per_block - 1` outputs, and each of those outputs into a 2-output
  transaction of the same block — the set then holds many small records;
- `main_blocks` blocks of `txs_per_block` transactions (and a coinbase): each transaction spends
  1 (60 %), 2 (30 %) or 3 (10 %) coins drawn uniformly at random from every coin spendable then
  (the whole set: outputs of any earlier block and of earlier transactions of the same block;
  not the main blocks' coinbases, so that every main-block transaction is valid in a mempool
  at the setup's tip) into 2 outputs (1 when the coins are small), paying a fee.

Invariants:
- Deterministic: the same arguments give the same blocks, byte for byte (`random.Random(seed)`,
  tags from a counter, timestamps from heights).
- Every block is valid: proof of work meets REGTEST_BITS, every input spends an output that
  exists and is unspent on the chain (a coinbase only 100 blocks deep), a parent precedes its
  child within a block, no zero-satoshi output.
- The model (`Chain.coins`, `Chain.muhash`) is computed from the generator's own bookkeeping and
  Core's coin serialisation (`chain.muhash`), never from a store.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from chain import Tx, TxIn, sha256d
from chain.build import build_block, build_tx, coinbase_tx, p2pkh
from chain.muhash import MuHash, coin_bytes

REGTEST_GENESIS = bytes.fromhex("0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206")[::-1]
SUBSIDY = 50 * 10**8
MATURITY = 100
FEE = 200
MIN_OUT = 1_000  # no output below this: a coin that would split smaller stays whole
Outpoint = tuple[bytes, int]
Coin = tuple[int, bool, int, bytes]  # (height, coinbase, satoshis, script), as Core's coinstats


@dataclass
class Chain:
    raws: list[bytes] = field(default_factory=list)  # the blocks, heights 1 …
    setup: int = 0  # blocks before the main ones (coinbases maturing, fan-outs)
    tx_raws: list[bytes] = field(default_factory=list)  # the main blocks' non-coinbase txs (kept on ask)
    coins: dict[Outpoint, Coin] = field(default_factory=dict)  # the confirmed set at the tip
    tip_hash: bytes = b""  # internal byte order
    n_txs: int = 0  # transactions in every block, coinbases included
    n_spending_txs: int = 0  # non-coinbase transactions
    setup_txs: int = 0  # transactions of the setup blocks, coinbases included

    @property
    def tip_height(self) -> int:
        return len(self.raws)

    @property
    def satoshis(self) -> int:
        return sum(c[2] for c in self.coins.values())

    def muhash(self) -> str:
        """The confirmed set's MuHash3072 as Core prints it, one coin at a time."""
        h = MuHash()
        for (t, v), (height, cb, sats, spk) in self.coins.items():
            h.insert(coin_bytes(t, v, height, cb, sats, spk))
        return h.hex()


class _Pool:
    """Spendable outpoints; a uniformly random one taken in O(1) (swap with the last)."""

    def __init__(self, rng: random.Random) -> None:
        self.items: list[Outpoint] = []
        self.rng = rng

    def add(self, op: Outpoint) -> None:
        self.items.append(op)

    def take(self) -> Outpoint:
        items = self.items
        k = self.rng.randrange(len(items))
        items[k], items[-1] = items[-1], items[k]
        return items.pop()

    def __len__(self) -> int:
        return len(self.items)


def _script(tags: Iterator[int]) -> bytes:
    return p2pkh(next(tags).to_bytes(20, "big"))


def generate(
    main_blocks: int, txs_per_block: int, fan_blocks: int = 4, seed: int = 1, keep_txs: bool = False
) -> Chain:
    """The chain described above (`keep_txs`: also every non-coinbase tx's bytes, for the
    mempool-first flow)."""
    if txs_per_block < 3 or fan_blocks < 1 or main_blocks < 0:
        raise ValueError("the chain needs at least 3 transactions a block and one fan-out block")
    rng = random.Random(seed)
    tags = itertools.count(1)
    out = Chain()
    coins = out.coins
    pool = _Pool(rng)
    matured: dict[int, Outpoint] = {}  # a setup coinbase's output by the height it matures at
    parent = REGTEST_GENESIS

    def add_block(height: int, txs: list[Tx]) -> None:
        nonlocal parent
        raw = build_block(parent, txs, timestamp=1_700_000_000 + height)
        parent = sha256d(raw[:80])
        out.raws.append(raw)
        out.n_txs += len(txs)
        out.n_spending_txs += len(txs) - 1
        if height <= out.setup:
            out.setup_txs += len(txs)
        if keep_txs and height > out.setup:
            out.tx_raws.extend(t.raw for t in txs[1:])

    def coinbase(height: int) -> Tx:
        cb = coinbase_tx(height, [(SUBSIDY, _script(tags))], tag=next(tags).to_bytes(4, "big"))
        coins[(cb.txid, 0)] = (height, True, SUBSIDY, cb.outputs[0].script)
        if height <= fan_blocks:
            matured[height + MATURITY] = (cb.txid, 0)
        return cb

    def made(tx: Tx, height: int, spendable: bool = True) -> None:
        for v, o in enumerate(tx.outputs):
            coins[(tx.txid, v)] = (height, False, o.satoshis, o.script)
            if spendable:
                pool.add((tx.txid, v))

    def spend(ops: list[Outpoint], n_out: int) -> Tx:
        """A tx spending `ops` (out of the set) into up to `n_out` outputs."""
        ins = []
        total = 0
        for op in ops:
            _h, _cb, sats, spk = coins.pop(op)
            total += sats
            ins.append(TxIn(op[0], op[1], b"\x51", 0xFFFFFFFF, sats, spk))
        value = total - FEE
        n_out = max(1, min(n_out, value // MIN_OUT))
        each = value // n_out
        outs = [(each, _script(tags)) for _ in range(n_out - 1)]
        outs.append((value - each * (n_out - 1), _script(tags)))
        return build_tx(ins, outs)

    out.setup = MATURITY + fan_blocks
    height = 0
    for _ in range(MATURITY):
        height += 1
        add_block(height, [coinbase(height)])
    for _ in range(fan_blocks):
        height += 1
        body = [coinbase(height)]
        fan = spend([matured.pop(height)], txs_per_block - 1)
        made(fan, height, spendable=False)
        body.append(fan)
        for v in range(len(fan.outputs)):
            child = spend([(fan.txid, v)], 2)
            made(child, height)
            body.append(child)
        add_block(height, body)
    for _ in range(main_blocks):
        height += 1
        body = [coinbase(height)]
        for _ in range(txs_per_block):
            r = rng.random()
            want = 1 if r < 0.6 else 2 if r < 0.9 else 3
            ops = [pool.take() for _ in range(min(want, len(pool)))]
            while sum(coins[op][2] for op in ops) < FEE + MIN_OUT and len(pool):
                ops.append(pool.take())  # too small: gather another
            tx = spend(ops, 2)
            made(tx, height)
            body.append(tx)
        add_block(height, body)
    out.tip_hash = parent
    return out
