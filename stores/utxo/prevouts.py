"""Previous outputs, for what a creation needs of them: each transaction's fee, and extended
copies of standard-format transactions for their blobs. Backend-neutral: a store mixes this in
and supplies `get_outputs` and `recent`.

Invariants:
- Previous outputs are looked up in the batch itself first, then in this process's recent
  creations, then in the store; one the store cannot give leaves the fee None (a convenience
  never fails a block's creation).
- `RecentOutputs` holds packed values only (see its docstring): never parsed objects.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chain import Tx
from stores.errors import StorageError
from stores.utxo.values import OutputInfo

log = logging.getLogger("utxoflow.store")
Outpoint = tuple[bytes, int]


class RecentOutputs:
    """The output values of the transactions this process created last, by txid, bounded: a
    block's transactions spend the previous blocks' mostly, and a fee needs its inputs' values.
    A txid names its outputs for good, so an entry is never stale (not even once its record is
    pruned or a refused block's records are deleted: a fee is computed from what the tx spends).

    Each entry is one bytes object (the values packed, 8 bytes each) under its own copy of the
    txid, never the parsed transaction's objects: kept for blocks after its block was dropped,
    a parsed `TxOut` would pin the memory pages of that block's freed objects, and a heap
    riddled with such pins slowed every piece of Python in the process by half over 400,000
    txs (`bench.scale`)."""

    def __init__(self, max_outputs: int = 200_000) -> None:
        self.max_outputs = max_outputs
        self._values: OrderedDict[bytes, bytes] = OrderedDict()
        self._count = 0

    def add(self, tx: Tx) -> None:
        outs = tx.outputs
        n = len(outs)
        if tx.txid in self._values or n > self.max_outputs // 4:
            return  # a huge tx would push everything else out
        self._values[bytes(bytearray(tx.txid))] = _pack(f"<{n}Q", *[o.satoshis for o in outs])
        self._count += n
        while self._count > self.max_outputs:
            _t, old = self._values.popitem(last=False)
            self._count -= len(old) >> 3

    def get(self, txid: bytes, vout: int) -> int | None:
        packed = self._values.get(txid)
        if packed is None or vout >= len(packed) >> 3:
            return None
        return int(_unpack_q(packed, vout << 3)[0])


_pack = struct.pack
_unpack_q = struct.Struct("<Q").unpack_from  # unsigned, as on the wire


class PrevoutsMixin:
    recent: RecentOutputs  # set by the store: output values of what this process created last

    if TYPE_CHECKING:  # the store's own

        def get_outputs(self, outpoints: Sequence[Outpoint]) -> dict[Outpoint, OutputInfo]: ...

    def _extend(self, wanted: Sequence[Tx], batch: Sequence[Tx]) -> dict[bytes, Tx]:
        """Extended copies of the standard-format transactions among `wanted` whose previous
        outputs are all known (in the batch or the store), so that their blobs need no parent
        lookups later; the others are left out (they are stored as they are)."""
        lacking = [t for t in wanted if not t.is_extended]
        if not lacking:
            return {}
        in_batch = {t.txid: t for t in batch}
        need = sorted(
            {(i.prev_txid, i.prev_vout) for t in lacking for i in t.inputs if i.prev_txid not in in_batch}
        )
        known = {op: (o.satoshis, o.script) for op, o in self._prevouts(need).items()}
        out: dict[bytes, Tx] = {}
        for t in lacking:
            ins = []
            for i in t.inputs:
                parent = in_batch.get(i.prev_txid)
                if parent is not None and i.prev_vout < len(parent.outputs):
                    o = parent.outputs[i.prev_vout]
                    prev: tuple[int, bytes] | None = (o.satoshis, o.script)
                else:
                    prev = known.get((i.prev_txid, i.prev_vout))
                if prev is None:
                    break
                ins.append(dataclasses.replace(i, prev_satoshis=prev[0], prev_script=prev[1]))
            else:
                out[t.txid] = dataclasses.replace(t, inputs=ins)
        return out

    def _prevouts(self, need: Sequence[tuple[bytes, int]]) -> dict[tuple[bytes, int], OutputInfo]:
        """Previous outputs for fees and extended blobs. They are a convenience: when the blob
        store cannot give an external parent's outputs, those stay unknown (fee None, the blob
        in standard format) rather than failing the creation of a whole block."""
        if not need:
            return {}
        try:
            return self.get_outputs(need)
        except StorageError as e:
            log.warning("previous outputs unavailable, fees left unknown: %s", e)
            return {}

    def _fees(self, txs: Sequence[Tx]) -> list[int | None]:
        """Each tx's fee; previous outputs a non-extended tx lacks come from the batch or store."""
        fees: list[int | None] = []
        lacking: list[int] = []
        for k, tx in enumerate(txs):
            ins = tx.inputs
            if tx.is_coinbase:
                fees.append(0)
                continue
            total = 0
            for i in ins:
                if i.prev_satoshis is None:
                    lacking.append(k)
                    total = -1
                    break
                total += i.prev_satoshis
            fees.append(None if total < 0 else total - sum([o.satoshis for o in tx.outputs]))
        if not lacking:
            return fees
        # Standard-format transactions: look their previous outputs up, in the batch first.
        in_batch = {t.txid: t for t in txs}
        need: set[tuple[bytes, int]] = set()
        values: dict[tuple[bytes, int], int] = {}
        for k in lacking:
            for i in txs[k].inputs:
                if i.prev_satoshis is not None:
                    continue
                parent = in_batch.get(i.prev_txid)
                if parent is not None and i.prev_vout < len(parent.outputs):
                    values[(i.prev_txid, i.prev_vout)] = parent.outputs[i.prev_vout].satoshis
                elif (v := self.recent.get(i.prev_txid, i.prev_vout)) is not None:
                    values[(i.prev_txid, i.prev_vout)] = v
                else:
                    need.add((i.prev_txid, i.prev_vout))
        if need:
            for key, info in self._prevouts(sorted(need)).items():
                values[key] = info.satoshis
        for k in lacking:
            tx = txs[k]
            total = 0
            for i in tx.inputs:
                v = i.prev_satoshis if i.prev_satoshis is not None else values.get((i.prev_txid, i.prev_vout))
                if v is None:
                    break
                total += v
            else:
                fees[k] = total - sum([o.satoshis for o in tx.outputs])
        return fees
