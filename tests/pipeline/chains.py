"""Generated chains for the pipeline tests: blocks with valid (regtest-easy) proof of work whose
transactions spend earlier outputs, and an independent model of the confirmed UTXO set."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from chain import Tx, TxIn, parse_block
from chain.build import REGTEST_BITS, build_block, build_tx, coinbase_tx, p2pkh, spend_input
from chain.tx import varint
from stores.utxo import Utxo, UtxoStore

_tag = itertools.count(1)
SUBSIDY = 50 * 10**8


def script(n: int | None = None) -> bytes:
    n = next(_tag) if n is None else n
    return p2pkh(n.to_bytes(20, "big"))


@dataclass
class Chain:
    """A branch of generated blocks, each knowing its height and its parent's hash."""

    parent: bytes = b"\x00" * 32
    height: int = 1
    blocks: list[bytes] = field(default_factory=list)  # raw blocks
    txs: list[list[Tx]] = field(default_factory=list)

    def add(self, txs: list[Tx] | None = None, coinbase: Tx | None = None) -> bytes:
        body = [coinbase or self.coinbase(), *(txs or [])]
        raw = build_block(self.parent, body, timestamp=1_700_000_000 + self.height)
        self.blocks.append(raw)
        self.txs.append(body)
        self.parent = parse_block(raw).hash
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
        return coinbase_tx(h, [(SUBSIDY, script())], tag=next(_tag).to_bytes(4, "big"))

    def fork(self, at: int) -> Chain:
        """A new branch whose next block follows block `at` (0-based index) of this one."""
        b = Chain(parse_block(self.blocks[at]).hash, self.height - (len(self.blocks) - at - 1))
        b.blocks, b.txs = self.blocks[: at + 1], self.txs[: at + 1]
        b.blocks, b.txs = list(b.blocks), list(b.txs)
        return b


def spend(*outs: tuple[Tx, int], n_outputs: int = 1, fee: int = 1000) -> Tx:
    total = sum(t.outputs[v].satoshis for t, v in outs) - fee
    ins = [spend_input(t, v) for t, v in outs]
    return build_tx(ins, [(total // n_outputs, script()) for _ in range(n_outputs)])


def confirmed_model(
    blocks: list[list[Tx]], base: Iterable[tuple[bytes, int]] = ()
) -> set[tuple[bytes, int]]:
    """The confirmed UTXO set a chain of blocks gives (over the outputs `base` of a snapshot),
    computed without the store."""
    utxos: set[tuple[bytes, int]] = set(base)
    for txs in blocks:
        for tx in txs:
            if not tx.is_coinbase:
                for i in tx.inputs:
                    utxos.discard((i.prev_txid, i.prev_vout))
            for v, o in enumerate(tx.outputs):
                if not (o.satoshis == 0 and (o.script[:1] == b"\x6a" or o.script[:2] == b"\x00\x6a")):
                    utxos.add((tx.txid, v))
    return utxos


def funding(n: int, satoshis: int = 10**8, n_outputs: int = 1) -> list[Tx]:
    """Transactions known to the store only through a UTXO snapshot (`snapshot_utxos`): their
    inputs name nothing real, so a generated chain can spend their outputs at once, without
    waiting 100 blocks for a coinbase to mature."""
    out = []
    for _ in range(n):
        tag = next(_tag).to_bytes(32, "big")
        outs = [(satoshis, script()) for _ in range(n_outputs)]
        out.append(build_tx([TxIn(tag, 0, b"\x51", 0xFFFFFFFF)], outs))
    return out


def snapshot_utxos(txs: Sequence[Tx], height: int, coinbase: bool = False) -> list[Utxo]:
    """Every output of `txs` as snapshot entries created at `height`."""
    return [
        Utxo(t.txid, v, o.satoshis, o.script, height, coinbase) for t in txs for v, o in enumerate(t.outputs)
    ]


def outpoints(txs: Sequence[Tx]) -> set[tuple[bytes, int]]:
    return {(t.txid, v) for t in txs for v in range(len(t.outputs))}


def assemble(header: bytes, txs: Sequence[Tx]) -> bytes:
    """A block's bytes from an 80-byte header and any list of transactions (a root that does
    not match, or a repeated transaction, is the point)."""
    assert len(header) == 80
    return header + varint(len(txs)) + b"".join(t.raw for t in txs)


SNAPSHOT_HEIGHT = 1000
SNAPSHOT_HASH = bytes.fromhex("5e" * 32)  # a block the chain starts from, known only by hash


def seed(
    utxo: UtxoStore, txs: Sequence[Tx], *, coinbase: Sequence[Tx] = (), coinbase_height: int = 0
) -> Chain:
    """Seed an empty store with a snapshot at SNAPSHOT_HEIGHT holding every output of `txs`
    (and of the `coinbase` ones, created at `coinbase_height`); the branch that continues it."""
    utxos = snapshot_utxos(txs, SNAPSHOT_HEIGHT) + snapshot_utxos(coinbase, coinbase_height, coinbase=True)
    utxo.import_utxos(utxos, height=SNAPSHOT_HEIGHT, block_hash=SNAPSHOT_HASH)
    return Chain(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1)


def confirmed(utxo: UtxoStore) -> set[tuple[bytes, int]]:
    """The store's confirmed UTXO set, as outpoints."""
    return {(u.txid, u.vout) for u in utxo.iter_utxos(confirmed=True)}
