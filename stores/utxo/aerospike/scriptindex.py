"""The script index on Aerospike (`stores.utxo.scriptindex`): each record keeps the keys of its live
outputs in a map bin, and a secondary index on that map's keys finds a script's records.

Invariants:
- Every record (master or child page) holds `scriptKeys` (`Record.script_keys`) and `liveKeys`
  (`codec.live_keys`: script key → how many of its slots with that key are unspent or frozen;
  no bin when none is). Both are written with the record; the Lua module changes `liveKeys` in
  the same record update as the slot it follows (a spend takes one off, an unspend or a
  take-back adds one back, freezing changes nothing), and a removed record takes its map with
  it. So the index is atomic with the records, as the SQL unit keeps its table.
- LIVE_KEYS_INDEX, on the map's keys, is one index for the whole namespace (every set's
  records, as the delete-at-height index; a query of one set uses it): a namespace holds at
  most a few hundred indexes, and a store's set is one of thousands.
- An output's place is (its master's `rid`, its vout), the SQL backend's (record id, vout), and
  cursors are the same text. `rid` is drawn from the store's counter when the master is
  created (`AerospikeBase._reserve_ids`; a page carries its master's), so a record created
  after a cursor was handed out sorts after it, and mining, reorgs and conflicts never move an
  output: pages chain, and a walk meets each output that stays unspent once.
- Cost: a page asks the index for the script's records (filtered on the server to those at or
  after the cursor's `rid`, and sorted here) and reads only its own outputs' masters and
  transaction bytes — O(the records holding the script's outputs), never O(the store). A walk
  of every page pays that per page: a script of millions of outputs is better walked with
  large pages (`scriptindex.PAGE_LIMIT`, as `script_balance` does).
"""

from __future__ import annotations

from typing import Any

from stores.utxo import scriptindex, slots, validate
from stores.utxo.aerospike import codec
from stores.utxo.aerospike.read import ReadMixin
from stores.utxo.scriptindex import ScriptUtxo

LIVE_KEYS_INDEX = "utxoflow_live_keys"  # (per namespace, as `store.DAH_INDEX`)
RID, SCRIPT_KEYS = codec.BINS["id"], codec.BINS["script_keys"]
FOUND_BINS = ["txid", "page", RID, "utxos", SCRIPT_KEYS]
# what `scriptindex.listed` reads of a master (its own slots too: an output spent since the query
# lists nothing), and its outputs (the transaction's bytes if it keeps them)
MASTER_BINS = [
    "txid", "conflicting", "creating", "unminedSince", *codec.BLOCK_BINS, "coinbase", "external",
    "totalExtraRecs", "utxos", codec.RAW, codec.RAW_FORMAT,
]  # fmt: skip
Place = tuple[int, int, bytes]  # (rid, vout, txid): an output's place in the index, and its tx


def create_index(client: Any, namespace: str) -> None:
    """Create LIVE_KEYS_INDEX; the client waits until it is built. One that exists already is
    IndexFoundError on older servers, and no error on newer ones."""
    import aerospike

    no_set: Any = None  # (the client's stubs say str; None is every set)
    client.index_map_keys_create(namespace, no_set, codec.LIVE_KEYS, aerospike.INDEX_NUMERIC, LIVE_KEYS_INDEX)


def live_slots(bins: dict[str, Any], packed: bytes) -> list[int]:
    """The slots of a record (its `utxos` and `scriptKeys`) that are live and hold an output
    whose script key packs to `packed`."""
    utxos, keys = bins.get("utxos") or b"", bins.get(SCRIPT_KEYS) or b""
    out: list[int] = []
    at = keys.find(packed)
    while at != -1:
        if not at & 7:  # (a match across two keys is none)
            if slots.is_live(utxos, (at >> 3) * slots.SLOT):
                out.append(at >> 3)
        at = keys.find(packed, at + 1)
    return out


class ScriptsMixin(ReadMixin, scriptindex.ScriptBalance):
    def script_utxos(
        self, scripthash: bytes, *, after: str | None = None, limit: int = 1000, confirmed: bool = False
    ) -> tuple[list[ScriptUtxo], str | None]:
        """A page of the unspent outputs of the script with this hash, in (rid, vout) order
        after the cursor, and the cursor after it (None: the last page). See the module for
        what it costs."""
        validate.hash32("scripthash", scripthash)
        scriptindex.check_limit(limit)
        key, pos = scriptindex.script_key(scripthash), scriptindex.parse_cursor(after)
        todo = self._places(key, pos)
        out: list[ScriptUtxo] = []
        done = 0
        while done < len(todo) and len(out) < limit:
            chunk = todo[done : done + limit - len(out)]
            done += len(chunk)
            out += self._script_listed(chunk, scripthash, confirmed)
        if done == len(todo):
            return out, None
        # the page is full, so every place of the last chunk was listed: the cursor is its last item's
        return out, scriptindex.cursor(todo[done - 1][:2])

    def _places(self, key: int, after: tuple[int, int]) -> list[Place]:
        """The places after `after` of the live outputs whose script key is `key`, in order."""
        import aerospike
        from aerospike import predicates
        from aerospike_helpers import expressions as exp

        where = predicates.contains(codec.LIVE_KEYS, aerospike.INDEX_TYPE_MAPKEYS, key)
        rid = exp.Cond(exp.BinExists(RID), exp.IntBin(RID), 0)  # (a record made without one: 0)
        from_rid = None if after[0] < 0 else exp.GE(rid, after[0]).compile()
        packed = key.to_bytes(8, "little", signed=True)
        size = self.batch_size
        seen: set[tuple[bytes, int]] = set()
        out: list[Place] = []
        for bins in self._query("listing a script's outputs", FOUND_BINS, where, from_rid):
            txid, page = bytes(bins["txid"]), int(bins.get("page") or 0)
            if (txid, page) in seen:  # (a query while partitions migrate may return one twice)
                continue
            seen.add((txid, page))
            r = int(bins.get(RID) or 0)
            for i in live_slots(bins, packed):
                if (r, page * size + i) > after:
                    out.append((r, page * size + i, txid))
        out.sort()
        return out

    def _script_listed(self, places: list[Place], scripthash: bytes, confirmed: bool) -> list[ScriptUtxo]:
        """What these places show (`scriptindex.listed`), in their order, read from their masters
        (a page's outputs are its transaction's: its master says whether and how they list)."""
        txids = list(dict.fromkeys(t for _r, _v, t in places))
        masters = self._found(txids, MASTER_BINS)
        vouts: dict[bytes, list[int]] = {}
        for _r, v, t in places:
            vouts.setdefault(t, []).append(v)
        recs = {t: codec.from_bins(b) for t, b in masters.items()}
        outputs = {
            t: self._outputs_of(rec, masters[t], vouts[t]) for t, rec in recs.items()
            if not (rec.conflicting or rec.creating)
        }  # fmt: skip
        out: list[ScriptUtxo] = []
        for r, v, t in places:
            u = scriptindex.listed(
                recs.get(t), v, outputs.get(t, {}).get(v), scripthash, scriptindex.cursor((r, v)),
                self.batch_size,
            )
            if u is not None and (u.confirmed or not confirmed):
                out.append(u)
        return out
