"""The one record type: a transaction's master record (page 0) or one of its child pages.

A record holds its outputs' UTXO slots packed (`stores.utxo.slots`: 68 bytes each, slot i of
page k is output kB + i for batch size B) and, on the master, the transaction's metadata. The
list-valued fields stay in their stored form (JSON text, concatenated hashes) until a rule needs
them: the hot paths (spend, set-mined) read only flags, counters and slots.

Invariants:
- `spent_utxos` of a record equals the number of its slots holding spending data (frozen is not
  spent). The master's `total_utxos`/`spent_utxos` count the whole transaction, every page
  included; a child page keeps its own.
- A master's `pages` holds only child pages loaded under its lock, by index (never page 0).
- `script_keys` is set when the record is created and never changes.
- Every change goes through `touch`, which names the changed fields: a backend writes exactly
  those (`dirty`) back, and a record with nothing dirty is not written at all.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from chain import Tx
from stores.utxo import slots
from stores.utxo.values import Spenders, TxMeta

SLOT = slots.SLOT
Block = tuple[int, int, int]  # (block id, height, subtree index)
_INPOINT = struct.Struct("<32sI")  # an input's parent txid ‖ vout
NO_BLOCKS = "[]"
NO_SPENDABLE = "{}"
# `Record.mined`, as a condition on a row: views and filters select by it.
MINED_SQL = "unmined_since IS NULL AND blocks <> '[]'"


@dataclass(slots=True, eq=False, repr=False)
class Record:
    txid: bytes
    utxos: bytearray
    total_utxos: int
    spent_utxos: int
    creating: bool = False
    page: int = 0  # 0: the master; k: child page k
    # -- the master's (a child page leaves them at their defaults) --
    id: int = 0  # the backend's row id (0: not stored yet)
    version: int = 0
    locktime: int = 0
    fee: int | None = None
    size_in_bytes: int = 0
    is_coinbase: bool = False
    spending_height: int = 0  # a coinbase's first spendable height (0: any)
    locked: bool = False
    conflicting: bool = False
    unmined_since: int | None = None
    created_at: int = 0
    preserve_until: int | None = None
    delete_at_height: int | None = None
    external: bool = False
    total_extra_recs: int = 0
    blocks: str = NO_BLOCKS  # JSON [[id, height, subtree], …]
    conflicting_children: bytes = b""  # 32-byte txids
    deleted_children: bytes = b""  # 32-byte txids of pruned children (a replay is INVALID_SPEND)
    reassignments: str = "[]"  # JSON [{offset, utxo_hash, new_utxo_hash, block_height}, …]
    spendable_in: str = NO_SPENDABLE  # JSON {vout: first spendable height} of reassigned outputs
    inpoints: bytes = b""  # 36 bytes per input: parent txid ‖ vout (LE u32)
    # 8 bytes per slot: the script index key of its output (`stores.utxo.scriptindex`), so that a
    # spend removes the output's index entry without reading the transaction
    script_keys: bytes = b""
    pages: dict[int, Record] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)
    partial: bool = False  # loaded for the rules only: the metadata none of them reads is absent

    def touch(self, *names: str) -> None:
        self.dirty.update(names)

    def __repr__(self) -> str:  # a partial record leaves fields unset: show what it has
        names = [n for n in self.__slots__ if n != "utxos" and hasattr(self, n)]
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"Record({shown}, utxos=<{len(getattr(self, 'utxos', b''))} bytes>)"

    # -- slots ----------------------------------------------------------------------------------
    def locate(self, vout: int, batch_size: int) -> tuple[Record, int] | None:
        """(the record holding output `vout`, its slot's byte offset there); None when that
        record is not loaded or has no such slot."""
        if vout >= batch_size and self.total_extra_recs:
            k = vout // batch_size
            rec = self.pages.get(k)
            if rec is None:
                return None
            off = (vout - k * batch_size) * SLOT
        else:
            rec, off = self, vout * SLOT
        if off + SLOT > len(rec.utxos) or rec.utxos.startswith(slots.NO_HASH, off):
            return None
        return rec, off

    def script_key(self, rec: Record, off: int) -> int:
        """The script index key of the output in the slot at byte offset `off` of this master or
        its page `rec` (`stores.utxo.scriptindex.script_key`)."""
        at = off // SLOT * 8
        return int.from_bytes(rec.script_keys[at : at + 8], "little", signed=True)

    def set_spending(self, rec: Record, off: int, data: bytes, spent: int) -> None:
        """Write a slot's spending data (in this master or its page `rec`); `spent` is the change
        of the spent count (+1 a spend, -1 an unspend, 0 a freeze)."""
        rec.utxos[off + 32 : off + SLOT] = data
        rec.spent_utxos += spent
        rec.touch("utxos", "spent_utxos")
        if rec is not self:
            self.spent_utxos += spent
            if spent:
                self.touch("spent_utxos")

    # -- list-valued fields, decoded when a rule needs them --------------------------------------
    @property
    def has_blocks(self) -> bool:
        return self.blocks != NO_BLOCKS

    @property
    def mined(self) -> bool:
        """Mined on the longest chain: in a block, and not marked off it (`MINED_SQL`)."""
        return self.unmined_since is None and self.blocks != NO_BLOCKS

    def height(self) -> int | None:
        """The height its outputs were created at: its block's (the lowest, should it list
        several), None while in no block. What a UTXO listing shows and the UTXO-set commitment
        hashes (`workers.chainstate.commitment`)."""
        if self.blocks == NO_BLOCKS:
            return None
        return min(b[1] for b in decode_blocks(self.blocks))

    def block_list(self) -> list[Block]:
        return list(decode_blocks(self.blocks))

    def set_block_list(self, blocks: list[Block]) -> None:
        self.blocks = encode_blocks(blocks)
        self.touch("blocks")

    def spendable(self) -> dict[int, int]:
        """vout → the first height a reassigned output may be spent at."""
        if self.spendable_in == NO_SPENDABLE:
            return {}
        return {int(k): v for k, v in json.loads(self.spendable_in).items()}

    def set_spendable(self, spendable: dict[int, int]) -> None:
        self.spendable_in = (
            json.dumps({str(k): v for k, v in sorted(spendable.items())}) if spendable else "{}"
        )
        self.touch("spendable_in")

    def reassignment_list(self) -> list[dict[str, Any]]:
        return [] if self.reassignments == "[]" else list(json.loads(self.reassignments))

    def add_reassignment(self, entry: dict[str, Any]) -> None:
        self.reassignments = json.dumps([*self.reassignment_list(), entry], separators=(",", ":"))
        self.touch("reassignments")

    def children(self, which: str) -> list[bytes]:
        """The 32-byte txids of `conflicting_children` or `deleted_children`."""
        blob: bytes = getattr(self, which)
        return [blob[i : i + 32] for i in range(0, len(blob), 32)] if blob else []

    def add_child(self, which: str, txid: bytes) -> bool:
        """Add `txid` to `conflicting_children` or `deleted_children` once; False if there."""
        blob: bytes = getattr(self, which)
        at = blob.find(txid)
        while at > 0 and at % 32:  # (a match across two entries is not one)
            at = blob.find(txid, at + 1)
        if at != -1:
            return False
        setattr(self, which, blob + txid)
        self.touch(which)
        return True

    def inpoint_list(self) -> list[tuple[bytes, int]]:
        return list(_INPOINT.iter_unpack(self.inpoints))

    def parent_txids(self) -> set[bytes]:
        """The txids this record spends from (each once): the first 32 bytes of each inpoint."""
        buf, step = self.inpoints, _INPOINT.size
        return {buf[i : i + 32] for i in range(0, len(buf), step)}


def encode_blocks(blocks: Sequence[Block]) -> str:
    """JSON of a block list, built directly (every value is an int): a block's create call
    encodes one per record."""
    if not blocks:
        return NO_BLOCKS
    return "[" + ",".join(f"[{int(a)},{int(b)},{int(c)}]" for a, b, c in blocks) + "]"


@lru_cache(maxsize=4096)
def decode_blocks(text: str) -> tuple[Block, ...]:
    """A block list from its JSON (a block's records all share one text: decoded once)."""
    return tuple((b[0], b[1], b[2]) for b in json.loads(text))


@lru_cache(maxsize=4096)
def _block_columns(text: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(ids, heights, subtree indexes) of a block list (immutable: shared by every TxMeta)."""
    blocks = decode_blocks(text)
    return tuple(b[0] for b in blocks), tuple(b[1] for b in blocks), tuple(b[2] for b in blocks)


def meta_of(rec: Record, tx: Tx | None = None) -> TxMeta:
    """The record as the store hands it out (`utxo tx`), with the transaction if given. Built
    positionally (TxMeta's field order), its lists decoded inline: a block's create call makes
    one per transaction."""
    assert not rec.partial, "a record loaded for the rules is not handed out"
    ids, heights, subtrees = _block_columns(rec.blocks)
    cc, dc, log = rec.conflicting_children, rec.deleted_children, rec.reassignments
    return tuple.__new__(TxMeta, (
        rec.txid, rec.fee, rec.size_in_bytes, rec.is_coinbase, rec.version, rec.locktime,
        list(_INPOINT.iter_unpack(rec.inpoints)), rec.locked, rec.creating, rec.conflicting,
        [cc[i : i + 32] for i in range(0, len(cc), 32)] if cc else [], rec.unmined_since, rec.created_at,
        rec.preserve_until, rec.delete_at_height, rec.spending_height, list(ids), list(heights),
        list(subtrees), rec.external, rec.total_extra_recs, rec.total_utxos, rec.spent_utxos,
        [] if log == "[]" else json.loads(log), [dc[i : i + 32] for i in range(0, len(dc), 32)] if dc else [],
        tx,
    ))  # fmt: skip


def spenders(recs: Mapping[bytes, Record], want: Iterable[tuple[bytes, int]], batch_size: int) -> Spenders:
    """The stored spender of each outpoint of `want` whose slot `recs` (masters with the pages
    holding those outpoints) has: None while it is unspent (or frozen); and the parents among
    them that are conflicting."""
    out = Spenders()
    bad: set[bytes] = set()
    for t, v in want:
        rec = recs.get(t)
        if rec is not None and (loc := rec.locate(v, batch_size)) is not None:
            out[(t, v)] = slots.decode(bytes(loc[0].utxos[loc[1] : loc[1] + SLOT]))[1]
            if rec.conflicting:
                bad.add(t)
    out.conflicting = frozenset(bad)
    return out
