"""The UTXO-set commitment: MuHash3072 over the confirmed set, as Bitcoin Core computes
`gettxoutsetinfo … muhash` (`chain.muhash`), kept per block in the state store.

Invariants:
- A block's commitment is its parent's with the coins the block creates multiplied in and the
  coins it spends divided out. Created: every output of its transactions that enters the UTXO
  set (not a data carrier), at the block's height, with its transaction's coinbase flag. Spent:
  every output its inputs spend from outside the block, as the store holds it (its height, its
  coinbase flag, satoshis, script). An output made and spent within the block is in neither:
  its two factors would cancel.
- An input whose parent the store does not hold (missing inputs allowed) takes nothing out: the
  set never held that output.
- So the commitment of block B equals the MuHash of `utxo utxos --confirmed` once B is the tip,
  whatever the path there (reorgs, refused blocks, batches): each block's value is a function of
  its own chain, stored with its hash when it is applied (in the state-store commit that applies
  it) and computed again if it is applied again (a rebase changes the heights).
- The chain's first block starts from the empty set (or the snapshot's imported set); a parent
  applied before commitments existed has its value computed once from the store's confirmed set,
  which is exactly its set while it is the tip (mempool activity leaves the confirmed set alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from chain import Block, hash_to_hex, is_data_carrier
from chain.muhash import MuHash, coin_bytes, elements
from stores.errors import StorageError
from stores.state import Commitment
from stores.utxo import OutputInfo, Utxo

Outpoint = tuple[bytes, int]
_ENTRY = 700  # what a held coin costs: its element (a 3072-bit number), its key and the dict's slot
EMPTY = Commitment(MuHash().to_bytes(), 0, 0)


@dataclass(slots=True)
class Delta:
    """What a block does to the confirmed set: the MuHash of its coins in over its coins out,
    and the change in outputs and satoshis."""

    muhash: MuHash
    utxos: int
    satoshis: int


def outside_inputs(block: Block) -> list[Outpoint]:
    """The outputs the block's inputs spend from transactions outside it."""
    in_block = {t.txid for t in block.txs}
    return [
        (i.prev_txid, i.prev_vout) for t in block.txs if not t.is_coinbase
        for i in t.inputs if i.prev_txid not in in_block
    ]


Coin = tuple[int, int]  # a coin's MuHash `element`, and its satoshis


class RecentCoins:
    """The coins the blocks this process applied last created — each as its MuHash element and
    satoshis — by outpoint, bounded by memory: a block mostly spends what the blocks just before
    it made, and these need neither a read of the store nor hashing again (the element is most
    of a coin's cost). A coin's element hashes its height, which is its block's on one chain
    only: the owner (`workers.chainstate.sequencer`) clears this whenever the block it applies does not
    continue the one it applied last, and on any disconnection, take-back or rebase. A coin a
    block spends leaves (a reorg that gives it back is such a break).

    Two generations of plain dicts, each up to half the bound: when the young one fills it
    becomes the old one and the old one goes, so the oldest coins leave in bulk at O(1) a coin
    (an OrderedDict's per-coin bookkeeping cost more than the lookups)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_coins = max_bytes // _ENTRY
        self._young: dict[Outpoint, Coin] = {}
        self._old: dict[Outpoint, Coin] = {}

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def clear(self) -> None:
        self._young = {}
        self._old = {}

    def take(self, ops: Iterable[Outpoint]) -> tuple[dict[Outpoint, Coin], list[Outpoint]]:
        """(the coins of `ops` held here, removed; the outpoints not held)."""
        found: dict[Outpoint, Coin] = {}
        missing: list[Outpoint] = []
        young, old = self._young.pop, self._old.pop
        for op in ops:
            c = young(op, None)
            o = old(op, None)  # (an outpoint added again may be in both: the young copy is newer)
            if c is None:
                c = o
                if c is None:
                    missing.append(op)
                    continue
            found[op] = c
        return found, missing

    def add(self, coins: Mapping[Outpoint, Coin]) -> None:
        half = max(self.max_coins // 2, 1)
        if len(self._young) + len(coins) > half:
            self._old = self._young
            self._young = {}
            if len(coins) > half:  # more than a generation at once: its newest half stays
                coins = dict(list(coins.items())[-half:])
        self._young.update(coins)


def created_coins(block: Block, height: int) -> dict[Outpoint, Coin]:
    """The coins the block adds to the set, in block order: every output but data carriers and
    those a later transaction of the same block spends (they never enter the set)."""
    in_block = {t.txid for t in block.txs}
    within = {
        (i.prev_txid, i.prev_vout) for t in block.txs if not t.is_coinbase
        for i in t.inputs if i.prev_txid in in_block
    }
    ops: list[Outpoint] = []
    datas: list[bytes] = []
    values: list[int] = []
    for t in block.txs:
        txid, cb = t.txid, t.is_coinbase
        for vout, o in enumerate(t.outputs):
            if is_data_carrier(o.satoshis, o.script) or (within and (txid, vout) in within):
                continue
            ops.append((txid, vout))
            datas.append(coin_bytes(txid, vout, height, cb, o.satoshis, o.script))
            values.append(o.satoshis)
    return dict(zip(ops, zip(elements(datas), values)))


def block_delta(
    block: Block, height: int, inputs: Iterable[Outpoint], spent: Mapping[Outpoint, OutputInfo],
    known: Mapping[Outpoint, Coin] = {},
) -> tuple[Delta, dict[Outpoint, Coin]]:
    """The block's change to the set, and the coins it created (by outpoint). `inputs`: its
    `outside_inputs`, whose coins are `known` or as the store has them in `spent`; an input in
    neither spends nothing of the set."""
    made = created_coins(block, height)
    n, sats = len(made), sum(v for _e, v in made.values())
    out: list[int] = []
    read: list[bytes] = []
    for op in inputs:
        c = known.get(op)
        if c is not None:
            out.append(c[0])
            sats -= c[1]
        else:
            info = spent.get(op)
            if info is None:
                continue
            if info.height is None:  # (the block's checks refuse spending an unmined parent)
                raise StorageError(
                    f"output {hash_to_hex(op[0])}:{op[1]} is spent by block {block.hash_hex} but its "
                    "transaction is in no block: the block's commitment cannot be computed"
                )
            read.append(coin_bytes(op[0], op[1], info.height, info.coinbase, info.satoshis, info.script))
            sats -= info.satoshis
        n -= 1
    h = MuHash()
    h.update_elements((e for e, _v in made.values()), [*out, *elements(read)])
    return Delta(h, n, sats), made


def advance(parent: Commitment, delta: Delta) -> Commitment:
    """The commitment after a block: its parent's with the block's delta applied."""
    h = MuHash.from_bytes(parent.muhash)
    h.combine(delta.muhash)
    return Commitment(h.to_bytes(), parent.utxos + delta.utxos, parent.satoshis + delta.satoshis)


def of_utxos(
    utxos: Iterable[Utxo], chunk: int = 20_000, tick: Callable[[], object] = lambda: None
) -> Commitment:
    """The commitment of a set of confirmed outputs, from scratch (bounded memory); `tick` is
    called after every `chunk` of them (a lease holder renews its lease)."""
    h = MuHash()
    n = sats = 0
    todo: list[bytes] = []
    for u in utxos:
        if u.height is None:
            raise ValueError(f"output {hash_to_hex(u.txid)}:{u.vout} has no height: it is not confirmed")
        todo.append(coin_bytes(u.txid, u.vout, u.height, u.coinbase, u.satoshis, u.script))
        n += 1
        sats += u.satoshis
        if len(todo) >= chunk:
            h.update(todo, ())
            todo = []
            tick()
    h.update(todo, ())
    return Commitment(h.to_bytes(), n, sats)


def muhash_hex(c: Commitment) -> str:
    """The commitment's MuHash as Bitcoin Core prints it (`gettxoutsetinfo`)."""
    return MuHash.from_bytes(c.muhash).hex()


def to_json(c: Commitment) -> dict[str, object]:
    return {"muhash": muhash_hex(c), "utxos": c.utxos, "satoshis": c.satoshis}
