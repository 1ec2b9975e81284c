"""The UTXO store and the state store belong together: the state store's chain (its tip, its
applied blocks) describes one UTXO store only, and a worker that finds the two apart refuses to
start, rather than apply blocks to a store that lacks their parents and refuse them for it.

Invariants:
- Every UTXO store has an id (`UtxoStore.identity`, made once); the state store keeps, under
  PAIRED, the id of the UTXO store its chain lives in. It is written when a worker first starts
  on the pair (or `utxo import-utxos` seeds the UTXO store) and never changes after.
- Apart, and refused, when: the state store names another UTXO store; or the UTXO store is below
  the state store's tip (an empty store, one restored from an older backup: blocks the state
  store counts as applied are not in it); or the state store knows no chain while the UTXO store
  has blocks applied that no snapshot explains (a mistyped UTXO_STATE_URL). The UTXO store is
  never below the tip in normal running: a block's records, and the store's height, are written
  before the state store's commit that applies it.
- A refusal names both URLs (passwords masked) and what each store says.
- A pair found apart while running (a store swapped under a worker) never makes a block
  invalid: the sequencer asks `apart` before it refuses a block, and a store fault is a
  StorageError, retried, instead (`Sequencer._apply`).
"""

from __future__ import annotations

from stores.sqldb import mask_url
from stores.state import StateStore
from stores.utxo import UtxoStore

PAIRED = "utxo_store"  # state meta: the id of the UTXO store the state store's chain lives in


def apart(state: StateStore, utxo: UtxoStore, pair: bool = False) -> str | None:
    """Why `utxo` is not the UTXO store of `state`'s chain (see the module), or None; with
    `pair`, a state store that names none yet is paired with `utxo` (when nothing says apart)."""
    mine = utxo.identity()
    paired = state.get_meta(PAIRED)
    names = f"UTXO_STORE_URL ({mask_url(utxo.url)}) and UTXO_STATE_URL ({mask_url(state.url)})"
    if paired is not None and paired != mine:
        return (f"{names} do not belong together: the state store's chain lives in UTXO store "
                f"{paired}, this UTXO store is {mine} (a mistyped URL, or another deployment's store?)")
    tip = state.tip()
    height = utxo.current_height()
    if tip is not None and tip.height is not None and height < tip.height:
        return (f"{names} do not belong together: the state store's tip is block "
                f"{tip.hash[::-1].hex()} at height {tip.height}, the UTXO store is at height "
                f"{height} (an empty store, a mistyped URL, or one restored from an older backup)")
    if paired is None and tip is None and height > 0:
        snap = utxo.snapshot_block()
        if snap is None or snap[0] != height:
            return (f"{names} do not belong together: the UTXO store has blocks applied up to "
                    f"height {height} and the state store knows no chain (a mistyped UTXO_STATE_URL?)")
    if paired is None and pair:
        state.set_meta(PAIRED, mine)
        now = state.get_meta(PAIRED)
        if now != mine:  # another worker paired it with another store meanwhile
            return (f"{names} do not belong together: the state store was just paired with "
                    f"UTXO store {now} by another worker, this UTXO store is {mine}")
    return None
