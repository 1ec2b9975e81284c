"""A sequencer over a small seeded chain, and the checks every refused block must pass.

`World` starts from a UTXO snapshot (so that generated transactions can spend at once, with no
100 blocks of coinbase maturity to wait for) and one applied block that mines a transaction;
`refused` submits a block and checks CONTRACT "Chain rules": status `invalid` with a reason,
the tip where it was, and nothing of the block left in the UTXO store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from chain import Tx, parse_block
from stores.state import BlockEntry, BlockStatus
from tests.pipeline.chains import (
    SNAPSHOT_HEIGHT,
    Chain,
    commitment_model,
    confirmed,
    confirmed_model,
    funding,
    outpoints,
    seed,
    snapshot_utxos,
    spend,
)
from workers.chainstate.commitment import muhash_hex
from workers.chainstate.sequencer import Sequencer

Outpoint = tuple[bytes, int]


class World:
    """funds[i]: one output of 1 BTC each, in the snapshot. Block 1001 (applied) mines `mined`,
    which spends funds[0] into two outputs."""

    def __init__(self, seq: Sequencer, n_funds: int = 8, coinbase_funds: Sequence[Tx] = (),
                 coinbase_height: int = 0) -> None:
        self.seq = seq
        self.funds = funding(n_funds)
        self.chain: Chain = seed(
            seq.utxo, self.funds, coinbase=coinbase_funds, coinbase_height=coinbase_height
        )
        self.base = outpoints(self.funds) | outpoints(coinbase_funds)
        self.base_utxos = snapshot_utxos(self.funds, SNAPSHOT_HEIGHT) + snapshot_utxos(
            coinbase_funds, coinbase_height, coinbase=True
        )
        self.mined = spend((self.funds[0], 0), n_outputs=2)
        self.txs: dict[bytes, Tx] = {t.txid: t for t in [*self.funds, *coinbase_funds]}
        self.add([self.mined])

    def add(self, txs: list[Tx] | None = None, chain: Chain | None = None) -> BlockEntry:
        """Add a valid block to the chain (or to a branch), submit it and check it was applied."""
        c = chain or self.chain
        raw = c.add(txs)
        self.txs.update((t.txid, t) for t in c.txs[-1])
        entry = self.seq.submit(raw)
        assert entry.status is BlockStatus.APPLIED, entry
        assert entry.height == c.height - 1
        self.check()
        return entry

    def model(self, chain: Chain | None = None) -> set[Outpoint]:
        return confirmed_model((chain or self.chain).txs, self.base)

    def check(self, chain: Chain | None = None) -> None:
        """The store's confirmed set and tip are those of `chain` (the valid one), and so is the
        tip's commitment (once a block is applied on the snapshot)."""
        c = chain or self.chain
        tip = self.seq.state.tip()
        assert tip is not None and tip.hash == c.parent and tip.height == c.height - 1
        assert confirmed(self.seq.utxo) == self.model(c)
        if c.txs:
            made = self.seq.state.get_commitment(tip.hash)
            assert made is not None
            want = commitment_model(c.txs, SNAPSHOT_HEIGHT + 1, self.base_utxos)
            assert (muhash_hex(made), made.utxos, made.satoshis) == want

    def mempool(self, *txs: Tx) -> None:
        """Create and spend transactions unmined, as the transaction pipeline does."""
        h = self.chain.height - 1
        for t in txs:
            self.seq.utxo.create(t, h)
            self.seq.utxo.spend(t, h)

    def unspent(self, ops: Iterable[Outpoint]) -> None:
        outs = self.seq.utxo.get_outputs(list(ops))
        for op, o in outs.items():
            assert o.spending_txid is None, f"{op[0][::-1].hex()}:{op[1]} is spent by {o.spending_txid!r}"

    def refused(
        self, raw: bytes, reason: str, *, keep: Iterable[bytes] = (), go_on: bool = True
    ) -> BlockEntry:
        """Submit a block that must be refused whole, for a reason matching the regex `reason`.
        `keep`: txids that were in the store before the block (mempool transactions). With
        `go_on`, then mine the outputs it tried to spend in a valid block."""
        block = parse_block(raw)
        tip = self.seq.state.tip()
        n_blocks = sum(self.seq.state.counts().values())
        entry = self.seq.submit(raw)
        stored = self.seq.state.get_block(block.hash)
        assert stored is not None and stored == entry
        assert stored.status is BlockStatus.INVALID, stored
        assert stored.reason and re.search(reason, stored.reason), stored.reason
        assert sum(self.seq.state.counts().values()) == n_blocks + 1
        after = self.seq.state.tip()
        assert after is not None and tip is not None and after.hash == tip.hash
        # nothing of it left: its new transactions are absent, what it spent is unspent
        known = {t.txid for txs in self.chain.txs for t in txs} | set(keep)
        new = [t.txid for t in block.txs if t.txid not in known]
        assert new and self.seq.utxo.existing(new) == set()
        model = self.model()
        tried = {(i.prev_txid, i.prev_vout) for t in block.txs if not t.is_coinbase for i in t.inputs}
        self.unspent(tried & model)
        self.check()
        assert self.seq.state.get_undo(block.hash) is None
        # and the chain goes on: a valid block spends what the refused one tried to
        ops = sorted(tried & model)
        if ops and go_on:
            self.add([spend(*((self.txs[t], v) for t, v in ops))])
        return stored
