"""Record-level state: block membership, the longest chain, locked, conflicting, preservation,
and what a parent remembers of its children (Teranode's setMined, setLocked, setConflicting,
preserveUntil, addDeletedChildren, and markTransactionsOnLongestChain).

Invariants:
- A block is in a record's list at most once. After set-mined or unset-mined a record in no
  block has `unmined_since` set (the height it left the chain); one in a block has it unset when
  the change was on the longest chain, and keeps what it had otherwise. Both clear `locked`.
- Mark-on-longest-chain writes `unmined_since` (unset, or the tip), overwriting. Marked on, the
  DAH rule is applied again (from the block after the tip, as set-mined counts): a fully spent
  record mined only on a fork is scheduled once its block joins the longest chain — nothing else
  would ever apply the rule to it (Teranode's mark leaves the DAH alone). Marked off, the DAH is
  left as Teranode leaves it: the unset-mined that follows in a reorg clears it.
- Lock removes the delete-at-height, unlock applies the rule again; preservation removes it
  until it expires, and an expired preservation schedules the record at height + retention.
- A conflicting child is listed on each parent's `conflicting_children` once, and stays listed
  (Teranode does not take it off when the flag clears). A pruned child is listed on each parent's
  `deleted_children`, so that it cannot spend there again.
"""

from __future__ import annotations

from stores.utxo.kernel.dah import apply_dah, mining_height
from stores.utxo.kernel.record import Block, Record


def set_mined(rec: Record, block: Block, on_longest_chain: bool, height: int, retention: int) -> None:
    blocks = rec.block_list()
    if all(b[0] != block[0] for b in blocks):
        rec.set_block_list([*blocks, block])
    if on_longest_chain and rec.unmined_since is not None:
        rec.unmined_since = None
        rec.touch("unmined_since")
    _unlock(rec)
    apply_dah(rec, height, retention)


def unset_mined(rec: Record, block_id: int, on_longest_chain: bool, height: int, retention: int) -> None:
    blocks = rec.block_list()
    at = next((k for k, b in enumerate(blocks) if b[0] == block_id), None)
    if at is not None:
        rec.set_block_list(blocks[:at] + blocks[at + 1 :])
    if not rec.has_blocks:
        rec.unmined_since = height
        rec.touch("unmined_since")
    elif on_longest_chain and rec.unmined_since is not None:
        rec.unmined_since = None
        rec.touch("unmined_since")
    _unlock(rec)
    apply_dah(rec, height, retention)


def _unlock(rec: Record) -> None:
    if rec.locked:
        rec.locked = False
        rec.touch("locked")


def mark_on_longest_chain(rec: Record, on: bool, tip: int, retention: int) -> None:
    rec.unmined_since = None if on else tip
    rec.touch("unmined_since")
    if on:
        apply_dah(rec, mining_height(tip, 0), retention)


def set_locked(rec: Record, value: bool, height: int, retention: int) -> None:
    rec.locked = value
    rec.touch("locked")
    if value:
        if rec.delete_at_height is not None:
            rec.delete_at_height = None
            rec.touch("delete_at_height")
    else:
        apply_dah(rec, height, retention)


def set_conflicting(rec: Record, value: bool, height: int, retention: int) -> None:
    rec.conflicting = value
    rec.touch("conflicting")
    apply_dah(rec, height, retention)


def preserve(rec: Record, until: int) -> None:
    rec.preserve_until = until
    rec.delete_at_height = None
    rec.touch("preserve_until", "delete_at_height")


def expire_preservation(rec: Record, height: int, retention: int) -> None:
    """A preservation that ran out at `height`: the record may go at height + retention."""
    rec.preserve_until = None
    rec.touch("preserve_until")
    if retention > 0:
        rec.delete_at_height = height + retention
        rec.touch("delete_at_height")


def add_conflicting_child(parent: Record, child: bytes) -> None:
    parent.add_child("conflicting_children", child)


def add_deleted_child(parent: Record, child: bytes) -> None:
    parent.add_child("deleted_children", child)
