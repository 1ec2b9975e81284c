"""The delete-at-height (DAH) rule: when a record may be pruned (Teranode's setDeleteAtHeight).

`apply_dah(rec, height, retention)` is called by every change that can make a record prunable
or keep it: spend, unspend, set-mined and unset, set-conflicting, unlock, and a mark onto the
longest chain (Teranode's does not: a fully spent record mined only on a fork was then never
pruned). It is not called by freeze, unfreeze, reassign or a mark off the longest chain
(Teranode's neither), and lock and preserve remove the DAH outright.

The rule, with new = height + retention:
1. retention 0 means never: nothing changes.
2. a preserved record (`preserve_until` set) is left as it is.
3. a conflicting record gets `new` unless it has a DAH already (the earliest stays).
4. a record whose every UTXO is spent, that is in a block and mined on the longest chain
   (`unmined_since` unset) gets `new` unless its DAH is later already (a DAH only moves later).
5. any other record has no DAH.

`first_mining_sql` is the rule's fast form for the commonest change of all, a block's records
mined for the first time on the longest chain, as one SQL expression per row (no read); a test
holds it to `apply_dah` for every record state.
"""

from __future__ import annotations

from stores.utxo.kernel.record import Record
from stores.utxo.slots import FROZEN, NO_HASH, SLOT, UNSPENT


def due(rec: Record, height: int, retention: int) -> int | None:
    """The DAH `rec` should carry after a change at `height`."""
    current = rec.delete_at_height
    if retention <= 0 or rec.preserve_until is not None:
        return current
    new = height + retention
    if rec.conflicting:
        return new if current is None else current
    if rec.spent_utxos >= rec.total_utxos and rec.mined:
        return new if current is None or current < new else current
    return None


def mining_height(tip: int, block_height: int) -> int:
    """The height a set-mined (or its unset) counts a DAH from: the block after the store's tip,
    as Teranode's setMined does (`currentBlockHeight`, the store's height + 1), or the block's
    own height where the store lags behind it (a catch-up), whichever is higher. Counting from
    the tip itself made a record mined at the tip's height prunable one block early."""
    return max(tip + 1, block_height)


def apply_dah(rec: Record, height: int, retention: int) -> None:
    """Set `rec`'s DAH by the rule (a master record: the whole transaction's)."""
    dah = due(rec, height, retention)
    if dah != rec.delete_at_height:
        rec.delete_at_height = dah
        rec.touch("delete_at_height")


def first_mining_sql(height: int, retention: int) -> str:
    """`due` as the SQL value of `delete_at_height` for a record that was in no block and is
    now mined on the longest chain, unlocked, at `height` (plain ints: no quoting needed)."""
    if retention <= 0:
        return "delete_at_height"
    new = int(height) + int(retention)
    return (
        "CASE WHEN preserve_until IS NOT NULL THEN delete_at_height "
        f"WHEN conflicting = 1 THEN COALESCE(delete_at_height, {new}) "
        f"WHEN spent_utxos >= total_utxos THEN CASE WHEN delete_at_height IS NULL "
        f"OR delete_at_height < {new} THEN {new} ELSE delete_at_height END "
        "ELSE NULL END"
    )


# -- pruning: which due record may go now (the pruner's rules, Teranode's pruner service) ----------


def is_due(rec: Record, height: int) -> bool:
    """`rec` may be pruned by a run at `height`: its DAH is set and at or below it."""
    return rec.delete_at_height is not None and rec.delete_at_height <= height


def spenders(rec: Record) -> set[bytes]:
    """The txids that spent an output of `rec` (its master slots and every loaded page)."""
    out: set[bytes] = set()
    for r in (rec, *rec.pages.values()):
        buf = bytes(r.utxos)
        for off in range(0, len(buf), SLOT):
            spend = buf[off + 32 : off + SLOT]
            if buf[off : off + 32] != NO_HASH and spend != UNSPENT and spend != FROZEN:
                out.add(spend[:32])
    return out


def stable_spender(child: Record | None, stable_at: int) -> bool:
    """Defensive mode: a spender is stable when it is mined on the longest chain and every block
    it is in is at or below `stable_at` (the run's height less the retention). One that cannot
    be found is not (a pruned one is known to the caller by the parent's `deleted_children`)."""
    if child is None or not child.mined:
        return False
    return max(h for _id, h, _sub in child.block_list()) <= stable_at
