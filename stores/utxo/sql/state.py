"""Record-level state changes: block membership, locked, conflicting, preservation, pruning.

Invariants:
- Each change reads the records under lock, applies one small function to each, recomputes
  delete-at-height with `rules.next_dah`, and writes them back in the same transaction.
- A block is in a record's block list at most once; `unmined_since` is None exactly while the
  record is mined on the longest chain, and a height otherwise.
- A conflicting record is listed in each of its parents' `conflicting_children`, once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from chain import hash_to_hex
from stores.utxo import validate
from stores.utxo.errors import StorageError, TxNotFound, UtxoError
from stores.utxo.gcpause import gc_paused
from stores.utxo.rules import next_dah
from stores.utxo.sql.base import TxState, chunks, split_inpoints
from stores.utxo.sql.pages import PageMixin

MINED_COLS = (
    "id, txid, blocks, conflicting, unmined_since, preserve_until, delete_at_height, total_utxos, "
    "spent_utxos, locked"
)
# `creating` is left alone: a half-made multi-record transaction is finished (pages first) by
# `_finish_creations` before it is mined, never by clearing its flag blindly.
SET_MINED = "UPDATE txs SET blocks = ?, locked = 0, unmined_since = ?, delete_at_height = ? WHERE id = ?"
# The block list and the DAH are the same for every record of a call, so they are literals
# (plain ints, validated before) and each row binds only its txid. `creating` is 0 by the
# guard and left out of SET, so the partial index on it is not touched.
FIRST_MINING = (
    "UPDATE txs SET blocks = '[{entry}]', locked = 0, unmined_since = NULL, "
    "delete_at_height = CASE WHEN preserve_until IS NOT NULL THEN NULL "
    "WHEN conflicting = 1 OR spent_utxos >= total_utxos THEN COALESCE(delete_at_height, {dah}) "
    "ELSE NULL END WHERE txid = ? AND blocks = '[]' AND creating = 0"
)
UNSET_MINED = "UPDATE txs SET blocks = ?, unmined_since = ?, delete_at_height = ? WHERE id = ?"


class _NotFirst(Exception):
    """Some record of the batch is already in a block, or missing: take the general path."""


log = logging.getLogger("utxoflow.store")


class StateMixin(PageMixin):
    @gc_paused
    def set_mined_multi(
        self,
        txids: Sequence[bytes],
        block_id: int,
        block_height: int,
        subtree_idx: int = 0,
        on_longest_chain: bool = True,
        unset: bool = False,
    ) -> list[list[int] | UtxoError]:
        """Add (or remove) a block in each record's block list; returns each record's block ids.

        The hot path of every block, so it reads and writes only the columns it changes. Blocks
        are stored as a JSON list of [id, height, subtree]; "[ID," can only start an entry, so a
        substring test finds a block id without decoding the list."""
        validate.number("block_id", block_id)
        validate.height("block_height", block_height)
        validate.number("subtree_idx", subtree_idx)
        validate.txids(txids)
        entry = f"[{block_id},{block_height},{subtree_idx}]"  # plain ints: checked just above
        key = f"[{block_id},"
        height = self._height(block_height)
        retention = self.retention
        wanted = list(dict.fromkeys(txids))

        def first_mining(cur: Any) -> bool:
            # The common case, a block's transactions mined for the first time on the longest
            # chain, needs no read: one UPDATE per record, guarded by "in no block yet". Its DAH
            # expression is `rules.next_dah` for a record now mined, unlocked and on the longest
            # chain (tests/stores/test_state.py checks the two agree). Any record it does not
            # match makes the caller run the general path, which is idempotent.
            sql = FIRST_MINING.format(entry=entry, dah=int(height + retention))
            cur.executemany(self._q(sql), [(t,) for t in sorted(wanted)])
            if cur.rowcount != len(wanted):
                raise _NotFirst()  # roll this unit back: the general path does the whole batch
            return True

        if not unset and on_longest_chain and wanted:
            try:
                self._run_write("set_mined", first_mining)
                return [[block_id] for _t in txids]
            except _NotFirst:
                pass

        if not unset:
            self._finish_creations(wanted, block_height)

        def unit(cur: Any) -> dict[bytes, str]:
            rows: dict[bytes, Any] = {}
            for part in self._chunks(sorted(wanted)):
                for r in self._select_txs(cur, MINED_COLS, part, True):
                    rows[bytes(r[1])] = r
            updates = []
            after: dict[bytes, str] = {}
            for txid in wanted:
                found = rows.get(txid)
                if found is None:
                    continue
                r = found
                blocks: str = r[2]
                locked = bool(r[9]) and unset
                if unset:
                    if key in blocks:
                        kept = [b for b in json.loads(blocks) if b[0] != block_id]
                        blocks = json.dumps(kept, separators=(",", ":"))
                    if blocks != "[]" and on_longest_chain:
                        unmined = r[4]  # still in another block of the longest chain
                    else:  # in no block, or only in blocks off the longest chain
                        unmined = r[4] if r[4] is not None else height
                elif key not in blocks:
                    blocks = f"[{entry}]" if blocks == "[]" else f"{blocks[:-1]},{entry}]"
                    unmined = None if on_longest_chain else r[4]
                else:
                    unmined = None if on_longest_chain else r[4]
                dah = next_dah(
                    current=r[6], conflicting=bool(r[3]), locked=locked, preserve_until=r[5],
                    spent=r[8], utxos=r[7], mined_on_longest=unmined is None and blocks != "[]",
                    height=height, retention=retention,
                )
                updates.append((blocks, unmined, dah, r[0]))
                after[txid] = blocks
            if updates:
                cur.executemany(self._q(UNSET_MINED if unset else SET_MINED), updates)
            return after

        after = self._run_write("set_mined", unit)
        out: list[list[int] | UtxoError] = []
        for t in txids:
            b = after.get(t)
            if b is None:
                out.append(TxNotFound(f"tx {t[::-1].hex()} not found", txid=t))
            else:
                out.append([block_id] if b == f"[{entry}]" else [e[0] for e in json.loads(b)])
        return out

    def _finish_creations(self, txids: Sequence[bytes], block_height: int) -> None:
        """Set-mined is a recovery path of two-phase creation: finish every listed transaction
        whose creation was left half done — a master still `creating`, or no record but the
        blob a creator wrote before it died."""

        def q(cur: Any) -> tuple[set[bytes], list[bytes]]:
            found: set[bytes] = set()
            creating: list[bytes] = []
            for part in self._chunks(sorted(txids)):
                for r in self._select_txs(cur, "txid, creating", part, False):
                    found.add(bytes(r[0]))
                    if r[1]:
                        creating.append(bytes(r[0]))
            return found, creating

        found, creating = self._run_read("set_mined", q)
        todo = creating
        unknown = [t for t in txids if t not in found]
        if unknown and self.external.configured:
            # Only a creator that died after writing its blob leaves an unknown txid to rebuild,
            # and it leaves its lock row too: one query here instead of a blob lookup per txid.
            todo = creating + self._locked_txids(unknown)
        for t in todo:
            try:
                self.complete_creation(t, block_height)
            except UtxoError as e:  # this one stays as it is (creating, or not found); the rest go on
                log.warning("set-mined could not finish the creation of tx %s: %s", hash_to_hex(t), e)

    def _locked_txids(self, txids: Sequence[bytes]) -> list[bytes]:
        def q(cur: Any) -> list[bytes]:
            out: list[bytes] = []
            for part in self._chunks(sorted(txids)):
                marks = ",".join("?" * len(part))
                cur.execute(self._q(f"SELECT txid FROM tx_locks WHERE txid IN ({marks})"), list(part))
                out += [bytes(r[0]) for r in cur.fetchall()]
            return out

        return self._run_read("set_mined", q)

    def mark_on_longest_chain(self, txids: Sequence[bytes], on: bool) -> None:
        def change(s: TxState, height: int) -> None:
            if on:
                if s.blocks:  # only a record in some block can be mined on the longest chain
                    s.unmined_since = None
            elif s.unmined_since is None:
                s.unmined_since = height

        self._update_states("mark_on_longest_chain", txids, change)

    def set_locked(self, txids: Sequence[bytes], value: bool) -> None:
        def change(s: TxState, _h: int) -> None:
            s.locked = value

        self._update_states("set_locked", txids, change, missing_ok=False)

    def set_conflicting(self, txids: Sequence[bytes], value: bool) -> None:
        validate.txids(txids)
        height = self._height()
        wanted = list(dict.fromkeys(txids))

        def unit(cur: Any) -> None:
            # Parents are found without locking (inpoints never change), so that the records
            # are then locked in one pass, in txid order, like every other write unit.
            own: dict[bytes, bytes] = {}
            for part in self._chunks(sorted(wanted)):
                own.update(
                    (bytes(r[0]), bytes(r[1])) for r in self._select_txs(cur, "txid, inpoints", part, False)
                )
            missing = [t for t in wanted if t not in own]
            if missing:
                raise TxNotFound(f"tx {missing[0][::-1].hex()} not found", txid=missing[0])
            parent_ids = {p for blob in own.values() for p, _v in split_inpoints(blob)}
            states = self._load_states(cur, parent_ids | set(own))
            for t in wanted:
                s = states[t]
                s.conflicting = value
                for p, _v in split_inpoints(s.inpoints):
                    ps = states.get(p)
                    if ps is None:
                        continue  # a parent already pruned: nothing to record on it
                    kids = [
                        ps.conflicting_children[i : i + 32]
                        for i in range(0, len(ps.conflicting_children), 32)
                    ]
                    if value and t not in kids:
                        kids.append(t)
                    elif not value and t in kids:
                        kids.remove(t)
                    ps.conflicting_children = b"".join(kids)
            for s in states.values():
                s.recompute_dah(height, self.retention)
            self._write_states(cur, states.values())

        self._run_write("set_conflicting", unit)

    def preserve_transactions(self, txids: Sequence[bytes], until: int) -> None:
        validate.height("until", until)
        def change(s: TxState, _h: int) -> None:
            s.preserve_until = until

        self._update_states("preserve_transactions", txids, change)

    def process_expired_preservations(self, height: int) -> int:
        validate.height("height", height)
        txids = self._txids_where(
            "process_expired_preservations",
            "preserve_until IS NOT NULL AND preserve_until <= ?",
            (height,),
        )

        def change(s: TxState, _h: int) -> None:
            if s.preserve_until is not None and s.preserve_until <= height:
                s.preserve_until = None

        for part in chunks(txids, 5000):
            self._update_states("process_expired_preservations", part, change, hint=height)
        return len(txids)

    def query_old_unmined(self, cutoff: int) -> list[bytes]:
        validate.height("cutoff", cutoff)
        return self._txids_where(
            "query_old_unmined",
            "unmined_since IS NOT NULL AND unmined_since <= ? ORDER BY unmined_since, txid",
            (cutoff,),
        )

    def query_dah(self, height: int, limit: int = 1000) -> list[bytes]:
        validate.height("height", height)
        validate.number("limit", limit)
        return self._txids_where(
            "query_dah",
            "delete_at_height IS NOT NULL AND delete_at_height <= ? ORDER BY delete_at_height, txid LIMIT ?",
            (height, limit),
        )

    def _txids_where(self, what: str, where: str, params: tuple[Any, ...]) -> list[bytes]:
        def q(cur: Any) -> list[bytes]:
            cur.execute(self._q(f"SELECT txid FROM txs WHERE {where}"), params)
            return [bytes(r[0]) for r in cur.fetchall()]

        return self._run_read(what, q)

    def delete_txs(self, txids: Sequence[bytes]) -> int:
        """Remove these records outright, with their pages and blobs: the undo of creations
        that must not remain (a block refused whole). Returns how many existed."""
        validate.txids(txids)
        keys = sorted(set(txids))

        def unit(cur: Any) -> list[TxState]:
            gone = list(self._load_states(cur, keys).values())
            if gone:
                cur.executemany(self._q("DELETE FROM tx_pages WHERE txid = ?"), [(s.txid,) for s in gone])
                cur.executemany(self._q("DELETE FROM tx_creations WHERE txid = ?"), [(s.txid,) for s in gone])
                cur.executemany(self._q("DELETE FROM txs WHERE id = ?"), [(s.id,) for s in gone])
            return gone

        gone = self._run_write("delete_txs", unit) if keys else []
        self._delete_blobs(gone)
        return len(gone)

    def _delete_blobs(self, gone: Sequence[TxState]) -> None:
        for s in gone:
            if s.external:
                try:
                    self.external.delete(s.txid)
                except StorageError as e:
                    log.warning("removed tx %s, but its blob stays: %s", hash_to_hex(s.txid), e)

    def delete_expired(self, txids: Sequence[bytes], height: int) -> int:
        """Delete those of these records whose delete-at-height is set and at or below `height`,
        checked again under lock: a record whose DAH was cleared since `query_dah` (an unspend in
        a reorg, a preservation, an unset-mined) stays."""
        validate.height("height", height)
        validate.txids(txids)
        keys = sorted(set(txids))

        def unit(cur: Any) -> list[TxState]:
            gone = [
                s for s in self._load_states(cur, keys).values()
                if s.delete_at_height is not None and s.delete_at_height <= height
            ]
            if gone:
                cur.executemany(self._q("DELETE FROM tx_pages WHERE txid = ?"), [(s.txid,) for s in gone])
                cur.executemany(self._q("DELETE FROM txs WHERE id = ?"), [(s.id,) for s in gone])
            cur.execute(self._q("DELETE FROM tx_locks WHERE expires_at <= ?"), (int(time.time() * 1000),))
            return gone

        gone = self._run_write("delete_expired", unit) if keys else []
        # The records are gone (committed) before their blobs: a record never names a missing
        # blob. A blob that cannot be removed now is left behind, named in the log; no record
        # refers to it any more.
        self._delete_blobs(gone)
        return len(gone)
