"""Where a mempool transaction's bytes are kept between `utxo enqueue tx` and the worker that
applies it: a small one travels with its registration, in the state store (one write per batch:
stores/state/txbytes.py); one over INLINE_TX_MAX goes to the blob store under its txid, as
blocks and external transactions do (its blob is then the external record's, when the UTXO store
keeps it externally). The message carries ids only, either way.

Invariants:
- The bytes are durable before the message that names them is sent: a large tx's blob is written
  before its registration, a small tx's bytes in the registration's own write.
- A reader looks in the state store first, then the blob store (large txs, and txs enqueued
  before bytes travelled with their registration), so either place serves every tx. A tx found
  in neither was settled already when its record is in the UTXO store or its recovery entry has
  ended (a copy of its message that came late: a redelivery, a re-send): that is `Settled`,
  never a refusal; only a tx with neither bytes nor a verdict is refused, to be enqueued again.
- The bytes kept are the tx as it came: extended (BIP-239) when it was, as the worker needs its
  inputs' amounts and scripts then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chain import ParseError, Tx, hash_to_hex, parse_tx
from stores.blob.protocol import BlobNotFound, blob_key
from stores.state.recovery import TERMINAL
from workers.runtime.services import Services

# A transaction this large or smaller is kept in the state store: a batch of 250 such is at most
# 16 MB in one write; nearly every transaction is under 1 KB, so almost none goes to the blob store.
INLINE_TX_MAX = 64 * 1024


def tx_bytes(tx: Tx) -> bytes:
    """The bytes kept of a tx: extended if they were."""
    return tx.serialize(extended=True) if tx.is_extended else tx.raw


def split(txs: Sequence[Tx]) -> tuple[dict[str, bytes], list[tuple[str, bytes]]]:
    """(message id → bytes kept with the registration, [(blob key, bytes)] for the blob store)."""
    kept: dict[str, bytes] = {}
    blobs: list[tuple[str, bytes]] = []
    for tx in txs:
        raw = tx_bytes(tx)
        if len(raw) <= INLINE_TX_MAX:
            kept[f"tx:{tx.txid_hex}"] = raw
        else:
            blobs.append((blob_key(tx.txid, "tx"), raw))
    return kept, blobs


@dataclass(frozen=True, slots=True)
class Unread:
    """A tx whose bytes cannot be had: `missing` (kept in neither place, nor settled) or not
    that tx."""

    why: str
    missing: bool


@dataclass(frozen=True, slots=True)
class Settled:
    """A tx whose bytes are gone because it was settled: `record` (its record is in the UTXO
    store: a delivery answers it as known) or its recovery entry ended (`outcome`)."""

    record: bool
    outcome: str = ""


def load_txs(svc: Services, txids: Sequence[bytes]) -> list[Tx | Unread | Settled]:
    """Each tx, parsed, or why it cannot be had: one state-store read for them all, then a blob
    read for each the state store did not keep, and for those found nowhere one read of the
    UTXO store and of their recovery entries."""
    idents = [f"tx:{hash_to_hex(t)}" for t in txids]
    kept = svc.state.tx_bytes(idents)
    out: list[Tx | Unread | Settled] = []
    for txid, ident in zip(txids, idents):
        raw = kept.get(ident)
        try:
            tx = parse_tx(svc.blobs.get(blob_key(txid, "tx")) if raw is None else raw)
        except BlobNotFound:
            out.append(Unread("its bytes are kept neither with its registration nor in the blob "
                              "store: enqueue it again", missing=True))
            continue
        except ParseError as e:
            out.append(Unread(f"its stored bytes are not a transaction ({e})", False))
            continue
        if tx.txid != txid:
            out.append(Unread(f"its stored bytes are another tx's ({tx.txid_hex})", False))
            continue
        out.append(tx)
    gone = [k for k, t in enumerate(out) if isinstance(t, Unread) and t.missing]
    if gone:
        there = svc.utxo.existing([txids[k] for k in gone])
        for k in gone:
            if txids[k] in there:
                out[k] = Settled(record=True)
            elif (entry := svc.state.recovery_entry(idents[k])) is not None and entry.status in TERMINAL:
                out[k] = Settled(record=False, outcome=entry.outcome)
    return out
