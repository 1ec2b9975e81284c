"""Pages of a multi-record transaction (seed 003 "Record Pagination", seed 000 record layout).

A transaction with more outputs than the store's batch size B spans pages: page 0, the master,
holds outputs 0…B-1 with all the metadata; page k (a child) holds outputs kB…(k+1)B-1. The page
holding output `vout` is `vout // B`, and within it the output's slot is `vout % B`.

Invariants:
- A page's slots are positional within the page: slot i of page k is output kB + i; an output
  that is a data carrier keeps its slot position with no UTXO in it.
- Page slots are built one page at a time from the transaction, so a million-output
  transaction never has every slot in memory at once.
- The master's `total_utxos` and `spent_utxos` count the whole transaction; a child keeps its
  own counts, so the master's spent count always equals the spent slots of every page.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256
from typing import Any

from chain import Tx
from chain.tx import varint
from stores.utxo import slots


@dataclass(frozen=True, slots=True)
class Page:
    """One child record's content: its index, packed slots and how many are real UTXOs."""

    txid: bytes
    index: int
    utxos: bytes
    n_utxos: int


@dataclass(frozen=True, slots=True)
class MasterRecord:
    """Page 0 of an external transaction: all its metadata and its first batch of slots."""

    txid: bytes
    version: int
    locktime: int
    fee: int | None
    size_in_bytes: int
    is_coinbase: bool
    spending_height: int
    inpoints: tuple[tuple[bytes, int], ...]
    total_utxos: int  # the whole transaction's
    total_extra_recs: int
    blocks: tuple[tuple[int, int, int], ...]  # (block id, height, subtree index)
    unmined_since: int | None
    locked: bool
    conflicting: bool
    delete_at_height: int | None
    created_at: int
    utxos: bytes  # page 0's slots
    block_height: int  # the height the creation was asked at (not a column: see `options`)

    def options(self, frozen: bool) -> dict[str, Any]:
        """How this creation was asked for, as the lock row keeps it for recovery."""
        return {
            "block_height": self.block_height, "blocks": [list(b) for b in self.blocks],
            "locked": self.locked, "conflicting": self.conflicting, "frozen": frozen, "fee": self.fee,
        }


@dataclass(frozen=True, slots=True)
class CreationState:
    """Where a multi-record creation stands: the master's flag and which pages exist."""

    creating: bool
    total_extra_recs: int
    pages: frozenset[int]  # existing page indexes, the master (0) included
    frozen: bool  # every real slot of page 0 is frozen: the creation asked for frozen outputs

    @property
    def missing(self) -> list[int]:
        return [k for k in range(self.total_extra_recs + 1) if k not in self.pages]


def page_count(n_outputs: int, batch_size: int) -> int:
    """How many records a transaction of `n_outputs` outputs needs (at least one)."""
    return max(1, -(-n_outputs // batch_size))


def tx_slots(tx: Tx, start: int = 0, stop: int | None = None, frozen: bool = False) -> tuple[bytes, int]:
    """The packed slots of outputs `start`…`stop`-1 of `tx` (all of them by default), unspent or
    frozen, and how many of them are real UTXOs. The one-record create path calls this for
    every transaction of every block, so the UTXO hash is inlined with its VarInts."""
    txid = tx.txid
    outs = tx.outputs if start == 0 and stop is None else tx.outputs[start:stop]
    parts: list[bytes] = []
    n = 0
    spend = slots.FROZEN if frozen else slots.UNSPENT
    for vout, o in enumerate(outs, start):
        sats, script = o.satoshis, o.script
        if sats == 0 and (script[:1] == b"\x6a" or script[:2] == b"\x00\x6a"):
            parts.append(slots.EMPTY_SLOT)
            continue
        vb = bytes((vout,)) if vout < 0xFD else varint(vout)
        if sats < 0xFD:
            sb = bytes((sats,))
        elif sats > 0xFFFFFFFF:
            sb = b"\xff" + sats.to_bytes(8, "little")
        elif sats > 0xFFFF:
            sb = b"\xfe" + sats.to_bytes(4, "little")
        else:
            sb = b"\xfd" + sats.to_bytes(2, "little")
        parts.append(sha256(txid + vb + script + sb).digest())
        parts.append(spend)
        n += 1
    return b"".join(parts), n


def page_slots(tx: Tx, index: int, batch_size: int, frozen: bool = False) -> tuple[bytes, int]:
    """The packed slots of page `index` of `tx`, and how many of them are real UTXOs."""
    return tx_slots(tx, index * batch_size, (index + 1) * batch_size, frozen)


def count_utxos(tx: Tx) -> int:
    """Real UTXOs of the whole transaction (outputs that are not data carriers)."""
    return sum(
        1 for o in tx.outputs
        if not (o.satoshis == 0 and (o.script[:1] == b"\x6a" or o.script[:2] == b"\x00\x6a"))
    )
