"""The one mapping between an Aerospike record's bins and a kernel `Record` (bin names are
Teranode's where it has one, and at most 15 characters, Aerospike's limit).

Invariants:
- Every `Record` field has one bin (`BINS`); booleans are 0/1 integers, a None field is an
  absent bin (and so is a zero among `AT_DEFAULT`), and the block list is three parallel lists
  (`blockIDs`, `blockHeights`, `subtreeIdxs`) as the Lua module (`utxoflow.lua`) reads them.
- `spentUtxos` is the record's own slots' count; a master's `pageSpent` holds what each child
  page last reported, and the kernel's whole-transaction `spent_utxos` is their sum.
- The reassignment log holds hashes as bytes (the Lua module writes them so); the kernel's
  JSON form, with hashes as Bitcoin shows them, is made here and nowhere else.
- `liveKeys` (the script index's, `stores.utxo.aerospike.scriptindex`) is no field: it is what
  `live_keys` makes of a record's slots and `scriptKeys`, written with every new record (and
  page), and kept so by the Lua module on every change of a slot.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from chain import hash_to_hex
from stores.utxo import slots
from stores.utxo.kernel.record import Record, encode_blocks

# Outputs per record (UTXO_BATCH_SIZE) on Aerospike: every spend reads and rewrites its whole
# record, and a record is capped at 1 MiB (max-record-size). bench.pagesize measured spends/s
# against a record's outputs on a local server: 128: 13,982; 512: 9,511; 1024: 8,480; 2048:
# 6,727; 4096: 3,193; 8192: 1,858 — 1024 keeps 60 % of the smallest pages' rate with a fully
# spent page of 68 KB, and a million-output transaction in 977 records rather than 7,813.
DEFAULT_BATCH_SIZE = 1024
MAX_BATCH_SIZE = 8192  # 544 KB of slots: with the metadata, well under the 1 MiB limit
# A transaction whose bytes and slots would make its record larger than this is external
# (its bytes in the blob store), whatever UTXO_MAX_TX_SIZE_IN_STORE says.
RECORD_BUDGET = 600 * 1024

# Record field -> bin
BINS: dict[str, str] = {
    "txid": "txid",
    "page": "page",
    "utxos": "utxos",
    "total_utxos": "recordUtxos",
    "spent_utxos": "spentUtxos",
    "creating": "creating",
    "version": "version",
    "locktime": "locktime",
    "fee": "fee",
    "size_in_bytes": "sizeInBytes",
    "is_coinbase": "coinbase",
    "spending_height": "spendingHeight",
    "locked": "locked",
    "conflicting": "conflicting",
    "unmined_since": "unminedSince",
    "created_at": "createdAt",
    "preserve_until": "preserveUntil",
    "delete_at_height": "deleteAtHeight",
    "external": "external",
    "total_extra_recs": "totalExtraRecs",
    "conflicting_children": "conflictingCs",
    "deleted_children": "deletedChildren",
    "inpoints": "inpoints",
    "script_keys": "scriptKeys",
    "id": "rid",  # the order of the script index (`scripts`), drawn when the master is created
}
BOOLS = frozenset({"creating", "is_coinbase", "locked", "conflicting", "external"})
# fields whose zero value is written as no bin (the Lua module and `from_bins` read an absent
# bin as it): fewer bins per record is less to write on every create. `fee` is not among them
# (0 is a fee; None is unknown), nor `page` (queries tell masters by it).
AT_DEFAULT = frozenset({
    *BOOLS, "spent_utxos", "spending_height", "total_extra_recs", "conflicting_children", "deleted_children",
    "inpoints", "version", "locktime", "script_keys", "id",
})  # fmt: skip
# (field, bin, absent at its zero, boolean): `to_bins`' walk of `BINS`, its tests made once
_FIELDS = tuple((f, b, f in AT_DEFAULT, f in BOOLS) for f, b in BINS.items())
BLOCK_BINS = ("blockIDs", "blockHeights", "subtreeIdxs")
PAGE_SPENT = "pageSpent"
RAW, RAW_FORMAT = "raw", "rawFormat"  # the transaction (or a snapshot's outputs) when not external
RAW_NONE, RAW_TX, RAW_OUTPUTS = 0, 1, 2
# what a child page mirrors of its master: the record-level rules of a spend run on the page
MIRRORED = ("conflicting", "locked", "is_coinbase", "spending_height", "deleted_children")
SPENDABLE_IN = "spendableIn"
REASSIGNMENTS = "reassignments"
LIVE_KEYS = "liveKeys"  # script key -> the record's live slots with that key (see the invariants)
assert all(
    len(b) <= 15 for b in (*BINS.values(), *BLOCK_BINS, PAGE_SPENT, SPENDABLE_IN, REASSIGNMENTS, LIVE_KEYS)
)
SLOT = slots.SLOT
_KEY = struct.Struct("<q")  # a script key as `Record.script_keys` packs it


def live_keys(rec: Record) -> dict[int, int]:
    """The `liveKeys` of a record (a master's own slots, or a page's): per script key, how many
    of its slots hold a UTXO that is unspent or frozen. A slot past the end of `script_keys`
    (a record made without them) counts for no key, as in the Lua module."""
    utxos, keys = rec.utxos, rec.script_keys
    n_slots = len(utxos) // SLOT
    n = min(n_slots, len(keys) >> 3)
    out: dict[int, int] = {}
    if (n == n_slots == rec.total_utxos and not rec.spent_utxos and rec.page == 0
            and not rec.total_extra_recs and rec.reassignments == "[]"):
        # a new one-record tx without data carriers, the common case: every slot is live
        # (a reassignment adds to the count without a slot: its record takes the long way)
        for (k,) in _KEY.iter_unpack(keys[: n * 8]):
            out[k] = out.get(k, 0) + 1
        return out
    live = slots.is_live
    for i in range(n):
        if not live(utxos, i * SLOT):
            continue
        (k,) = _KEY.unpack_from(keys, i * 8)
        out[k] = out.get(k, 0) + 1
    return out


def to_bins(rec: Record, raw_format: int = RAW_NONE, raw: bytes | None = None) -> dict[str, Any]:
    """Every bin of `rec` (a None field: no bin), with the transaction's bytes if given."""
    bins: dict[str, Any] = {}
    if raw is not None:
        bins[RAW], bins[RAW_FORMAT] = raw, raw_format
    for field, name, at_default, boolean in _FIELDS:
        value = getattr(rec, field)
        if value is None or (at_default and not value):
            continue
        if boolean:
            value = int(value)
        elif type(value) is bytearray:
            value = bytes(value)
        bins[name] = value
    live = live_keys(rec)
    if live:
        bins[LIVE_KEYS] = live
    if rec.page == 0:
        blocks = rec.block_list()
        if blocks:
            for name, column in zip(BLOCK_BINS, zip(*blocks)):
                bins[name] = list(column)
        spendable = rec.spendable()
        if spendable:
            bins[SPENDABLE_IN] = spendable
        log = rec.reassignment_list()
        if log:
            bins[REASSIGNMENTS] = [
                {**e, "utxo_hash": bytes.fromhex(e["utxo_hash"])[::-1],
                 "new_utxo_hash": bytes.fromhex(e["new_utxo_hash"])[::-1]}
                for e in log
            ]  # fmt: skip
    return bins


def page_bins(page: Record, master: Record) -> dict[str, Any]:
    """A child page's bins: its own slots, counts, script keys and `liveKeys`, and what it
    mirrors of its master (its record-level fields, and its `rid`: the page's outputs sort
    with the master's)."""
    bins: dict[str, Any] = {
        "txid": page.txid, "page": page.page, "utxos": bytes(page.utxos), "recordUtxos": page.total_utxos,
        "spentUtxos": page.spent_utxos, "creating": int(page.creating),
    }  # fmt: skip
    if page.script_keys:
        bins[BINS["script_keys"]] = page.script_keys
    if master.id:
        bins[BINS["id"]] = master.id
    live = live_keys(page)
    if live:
        bins[LIVE_KEYS] = live
    for field in MIRRORED:
        value = getattr(master, field)
        bins[BINS[field]] = int(value) if field in BOOLS else value
    return bins


def from_bins(bins: dict[str, Any]) -> Record:
    """The `Record` these bins hold (a master's `spent_utxos` counts its pages' reports)."""
    values: dict[str, Any] = {}
    for field, name in BINS.items():
        if name not in bins or bins[name] is None:
            continue
        value = bins[name]
        if field in BOOLS:
            value = value == 1
        elif field == "utxos":
            value = bytearray(value)
        elif isinstance(value, bytearray):
            value = bytes(value)
        values[field] = value
    values.setdefault("utxos", bytearray())
    values.setdefault("total_utxos", 0)
    values.setdefault("spent_utxos", 0)
    rec = Record(**values)
    reports = bins.get(PAGE_SPENT) or {}
    rec.spent_utxos += sum(spent for _gen, spent in reports.values())
    ids = bins.get(BLOCK_BINS[0]) or []
    if ids:
        rec.blocks = encode_blocks(list(zip(ids, bins[BLOCK_BINS[1]], bins[BLOCK_BINS[2]])))
    rec.set_spendable(dict(bins.get(SPENDABLE_IN) or {}))
    log = bins.get(REASSIGNMENTS) or []
    if log:
        rec.reassignments = json.dumps(
            [
                {"offset": e["offset"], "utxo_hash": hash_to_hex(bytes(e["utxo_hash"])),
                 "new_utxo_hash": hash_to_hex(bytes(e["new_utxo_hash"])), "block_height": e["block_height"]}
                for e in log
            ],
            separators=(",", ":"),
        )  # fmt: skip
    rec.dirty.clear()
    return rec
