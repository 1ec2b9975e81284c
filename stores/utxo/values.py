"""The values the UTXO store takes and hands out (the kernel's `Record` is not among them: that is what
the store keeps). Hashes are internal byte order; `to_json` shows them reversed."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from chain import Tx, hash_to_hex


@dataclass(frozen=True, slots=True)
class BlockInfo:
    block_id: int
    block_height: int
    subtree_idx: int = 0


class Standing(NamedTuple):
    """Where a held transaction stands, as a block's checks need it (`UtxoStore.standing`)."""

    mined: bool  # on the longest chain (`Record.mined`)
    conflicting: bool


class Spend(NamedTuple):
    """One output spent by one input: what `spend` returns and `unspend` takes back.

    A NamedTuple rather than a dataclass: a block makes thousands of these per call, and tuple
    construction costs a fraction of a frozen dataclass's."""

    txid: bytes
    vout: int
    utxo_hash: bytes
    spending_txid: bytes
    spending_vin: int


class TxMeta(NamedTuple):
    """A transaction's record, as the data model names its fields (snake_case).

    A NamedTuple (immutable; `_replace` makes a changed copy): `create_many` returns one per
    transaction of a block, and a tuple is built in a third of a dataclass's time. Sequence
    fields default to empty tuples so that no default is shared and mutable."""

    txid: bytes
    fee: int | None = None
    size_in_bytes: int = 0
    is_coinbase: bool = False
    version: int = 0
    locktime: int = 0
    inpoints: Sequence[tuple[bytes, int]] = ()
    locked: bool = False
    creating: bool = False
    conflicting: bool = False
    conflicting_children: Sequence[bytes] = ()
    unmined_since: int | None = None
    created_at: int = 0
    preserve_until: int | None = None
    delete_at_height: int | None = None
    spending_height: int = 0
    block_ids: Sequence[int] = ()
    block_heights: Sequence[int] = ()
    subtree_idxs: Sequence[int] = ()
    external: bool = False
    total_extra_recs: int = 0
    total_utxos: int = 0
    spent_utxos: int = 0
    reassignments: Sequence[dict[str, Any]] = ()
    deleted_children: Sequence[bytes] = ()
    tx: Tx | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "txid": hash_to_hex(self.txid),
            "fee": self.fee,
            "size_in_bytes": self.size_in_bytes,
            "is_coinbase": self.is_coinbase,
            "version": self.version,
            "locktime": self.locktime,
            "inpoints": [f"{hash_to_hex(t)}:{v}" for t, v in self.inpoints],
            "locked": self.locked,
            "creating": self.creating,
            "conflicting": self.conflicting,
            "conflicting_children": [hash_to_hex(c) for c in self.conflicting_children],
            "unmined_since": self.unmined_since,
            "created_at": self.created_at,
            "preserve_until": self.preserve_until,
            "delete_at_height": self.delete_at_height,
            "spending_height": self.spending_height,
            "block_ids": list(self.block_ids),
            "block_heights": list(self.block_heights),
            "subtree_idxs": list(self.subtree_idxs),
            "external": self.external,
            "total_extra_recs": self.total_extra_recs,
            "total_utxos": self.total_utxos,
            "spent_utxos": self.spent_utxos,
            "reassignments": list(self.reassignments),
            "deleted_children": [hash_to_hex(c) for c in self.deleted_children],
        }


class SpendStatus(enum.Enum):
    OK = "ok"
    SPENT = "spent"
    IMMATURE = "immature"
    FROZEN = "frozen"
    CONFLICTING = "conflicting"
    LOCKED = "locked"
    NOT_FOUND = "not_found"


@dataclass(frozen=True, slots=True)
class SpendInfo:
    status: SpendStatus
    spending_txid: bytes | None = None
    spending_vin: int | None = None
    until: int | None = None  # IMMATURE / FROZEN-until: the first height it becomes spendable


class Spenders(dict[tuple[bytes, int], "bytes | None"]):
    """The stored spender of each outpoint asked for (None: unspent), and which of their parents
    are conflicting (`conflicting`): read together, so that a mempool tx checking its inputs
    learns both in one read (`workers.chainstate.mempool.hold_inputs`)."""

    conflicting: frozenset[bytes] = frozenset()

    def __repr__(self) -> str:  # (equality is the dict's: `conflicting` shown, not compared)
        return f"Spenders({dict.__repr__(self)}, conflicting={set(self.conflicting)!r})"


@dataclass(frozen=True, slots=True)
class OutputInfo:
    """One output as `utxo outpoint` shows it."""

    txid: bytes
    vout: int
    utxo_hash: bytes
    satoshis: int
    script: bytes
    spending_txid: bytes | None
    spending_vin: int | None
    frozen: bool
    spendable_in: int | None
    height: int | None = None  # its transaction's block height (`Record.height`); None: in none
    coinbase: bool = False

    @property
    def state(self) -> str:
        if self.frozen:
            return "frozen"
        return "spent" if self.spending_txid is not None else "unspent"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"state": self.state, "utxo_hash": hash_to_hex(self.utxo_hash)}
        if self.spending_txid is not None:
            d["spending_txid"] = hash_to_hex(self.spending_txid)
            d["spending_vin"] = self.spending_vin
        d["satoshis"] = self.satoshis
        d["script"] = self.script.hex()
        d["height"] = self.height
        d["coinbase"] = self.coinbase
        if self.spendable_in is not None:
            d["spendable_in"] = self.spendable_in
        return d


class Utxo(NamedTuple):
    """One entry of a UTXO listing (the confirmed view or all unspent outputs).

    A NamedTuple: listings yield millions of these, and a tuple is built several times faster
    than a frozen dataclass."""

    txid: bytes
    vout: int
    satoshis: int
    script: bytes
    height: int | None
    coinbase: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "txid": hash_to_hex(self.txid),
            "vout": self.vout,
            "satoshis": self.satoshis,
            "script": self.script.hex(),
            "height": self.height,
            "coinbase": self.coinbase,
        }

    def json_line(self) -> str:
        """`json.dumps(self.to_json())` plus a newline, built directly: every value is an int,
        null, a boolean or hex, so nothing needs escaping, and a listing of millions of UTXOs
        spends its time on the store rather than on the encoder."""
        height = "null" if self.height is None else int(self.height)
        return (
            f'{{"txid": "{self.txid[::-1].hex()}", "vout": {int(self.vout)}, '
            f'"satoshis": {int(self.satoshis)}, "script": "{self.script.hex()}", '
            f'"height": {height}, "coinbase": {"true" if self.coinbase else "false"}}}\n'
        )


@dataclass(frozen=True, slots=True)
class UtxoStats:
    utxos: int
    satoshis: int
    txs: int
    height: int

    def to_json(self) -> dict[str, Any]:
        return {"utxos": self.utxos, "satoshis": self.satoshis, "txs": self.txs, "height": self.height}


LOCK_TYPE = "tx_creation"


@dataclass(frozen=True, slots=True)
class CreationLock:
    txid: bytes
    created_at: int  # ms since the epoch
    expires_at: int
    process_id: int
    hostname: str
    expected_recs: int

    def to_json(self) -> dict[str, Any]:
        return {
            "txid": hash_to_hex(self.txid), "lock_type": LOCK_TYPE, "created_at": self.created_at,
            "expires_at": self.expires_at, "process_id": self.process_id, "hostname": self.hostname,
            "expected_recs": self.expected_recs,
        }


@dataclass(slots=True)
class PruneResult:
    """What one prune call did with the records it was given (the pruner sums these per job)."""

    deleted: int = 0  # records removed (a multi-record transaction counts once)
    not_due: int = 0  # missing, or no longer due under lock (a DAH cleared since the query)
    defensive_kept: int = 0  # kept: a spender is not mined and stable yet (defensive mode)
    blob_kept: int = 0  # kept: their external blob could not be removed (next run tries again)
    blobs_deleted: int = 0

    def add(self, other: PruneResult) -> None:
        for f in PruneResult.__slots__:  # type: ignore[attr-defined]
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def to_json(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in PruneResult.__slots__}  # type: ignore[attr-defined]
