"""What `create_many` decides before any backend writes, and how it reports after: written once
for every backend (a backend's create mixes this in and supplies only its writes).

Invariants:
- Every argument is checked before anything is built; a tx the kernel refuses, or one that
  appears twice in the call, gets its error and is never written.
- Each other tx takes exactly one path: one record (its master, built by the kernel's
  `create.masters` with the call's options) or the external, multi-record path, as the
  backend's `external_if` says.
- A created tx's outputs are remembered (`recent`) for the fees of the next creations; a tx
  that failed is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from chain import Tx
from stores.errors import StoreError
from stores.utxo import validate
from stores.utxo.errors import TxExists
from stores.utxo.kernel import create
from stores.utxo.kernel.record import Record, meta_of
from stores.utxo.prevouts import PrevoutsMixin
from stores.utxo.values import BlockInfo, TxMeta

Result = TxMeta | Record | StoreError | None


@dataclass
class CreatePlan:
    results: list[Result]  # per tx: its Record (one-record path), its error, or None (external)
    fees: list[int | None]
    single: list[int] = field(default_factory=list)  # indexes of the one-record path, in order
    external: list[int] = field(default_factory=list)  # indexes of the external path


class CreatePlanMixin(PrevoutsMixin):
    batch_size: int
    retention: int
    height_for: Callable[[int], int]  # the store's (its base class's)
    create_many: Callable[..., Sequence[TxMeta | StoreError | None]]  # the backend's

    def create(
        self,
        tx: Tx,
        block_height: int,
        mined_block_infos: Sequence[BlockInfo] = (),
        locked: bool = False,
        conflicting: bool = False,
        frozen: bool = False,
    ) -> TxMeta:
        """One tx, as `create_many` of one: its record as created, or its error raised."""
        (r,) = self.create_many([tx], block_height, mined_block_infos, locked, conflicting, frozen)
        if isinstance(r, StoreError):
            raise r
        assert r is not None
        return r

    def _plan_creates(
        self,
        txs: Sequence[Tx],
        block_height: int,
        mined_block_infos: Sequence[BlockInfo],
        *,
        locked: bool,
        conflicting: bool,
        frozen: bool,
        external_if: Callable[[Tx], bool],
    ) -> CreatePlan:
        validate.height("block_height", block_height)
        for b in mined_block_infos:
            validate.number("block_id", b.block_id)
            validate.height("block height", b.block_height)
            validate.number("subtree_idx", b.subtree_idx)
        plan = CreatePlan([None] * len(txs), self._fees(txs))
        make = create.masters(
            block_height,
            [(b.block_id, b.block_height, b.subtree_idx) for b in mined_block_infos],
            batch_size=self.batch_size,
            retention=self.retention,
            dah_height=self.height_for(block_height),
            created_at=int(time.time() * 1000),
            locked=locked,
            conflicting=conflicting,
            frozen=frozen,
        )
        results, fees = plan.results, plan.fees
        seen: set[bytes] = set()
        for i, tx in enumerate(txs):
            txid = tx.txid
            refused = create.refusal(tx)
            if refused is not None:
                results[i] = refused
                continue
            if txid in seen:
                results[i] = TxExists(f"tx {tx.txid_hex} appears twice in the batch", txid=txid)
                continue
            seen.add(txid)
            if external_if(tx):
                plan.external.append(i)
                continue
            results[i] = make(tx, fees[i])
            plan.single.append(i)
        return plan

    def _created(
        self, txs: Sequence[Tx], results: Sequence[Result], meta: bool
    ) -> list[TxMeta | StoreError | None]:
        """`create_many`'s answer once the writes are done (see the module)."""
        out: list[TxMeta | StoreError | None] = []
        for tx, r in zip(txs, results, strict=True):
            if isinstance(r, StoreError):
                out.append(r)
                continue
            self.recent.add(tx)
            out.append(None if not meta else meta_of(r, tx) if isinstance(r, Record) else r)
        return out
