"""The chain sequencer: which blocks are known, which chain is best, and applying it in order
(CONTRACT "Chain rules", ARCHITECTURE "Applying a block").

Invariants:
- Blocks are applied strictly in chain order, one at a time, by whoever holds the chain's
  lease; any number of workers may call `advance`, and all but one return at once.
- The tip is the applied block of the best chain: the connected, not-invalid block of most
  cumulative work (first seen wins a tie). A heavier branch makes `advance` disconnect blocks
  back to the fork point, then apply the branch.
- A block is refused whole (status `invalid`, a reason) for bad proof of work, a merkle root
  that does not match (or a duplicated-last-pair mutation), a repeated txid, or a rule its
  transactions break when applied; its descendants are invalid too. Nothing of it remains and
  the tip stays where it was.
- The first block whose parent is unknown while the chain is empty is the base: its height is
  its BIP34 height, else 0 (1 for a child of a well-known genesis). A store seeded with a UTXO
  snapshot continues from the snapshot's block. Any later block with an unknown parent waits
  as an orphan until the parent arrives.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from chain import Block, ParseError, bip34_height, block_work, check_pow, hex_to_hash, parse_block
from stores.blob.protocol import BlobNotFound, BlobStore, blob_key
from stores.errors import StorageError
from stores.lease import holder_id
from stores.state import BlockEntry, BlockStatus, StateStore
from stores.utxo import UtxoStore
from workers.blockapply import BlockApplier, BlockRefused
from workers.fanout import Fanout, LocalFanout, settle_block

log = logging.getLogger("utxoflow.sequencer")

GENESIS = {
    hex_to_hash(h)
    for h in (
        "000000000019d6689c085ae165831e934ff763ae46a2a6c172b3f1b60a8ce26f",  # mainnet
        "000000000933ea01ad0ee984209779baaec3ced90fa3f408719526f8d77f4943",  # testnet
        "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206",  # regtest
    )
}
LEASE = "chain"  # applying the best chain
INDEX_LEASE = "index"  # adding blocks to the index
APPLYING = "applying"  # state meta: the block being applied now (its undo record says what is new)
SNAPSHOT = "UTXO snapshot"  # the reason field of a snapshot's base block (it has no bytes)
PARSED_KEPT = 3  # blocks kept parsed by `load`
CONNECTED = (BlockStatus.PENDING, BlockStatus.APPLIED, BlockStatus.SIDE)


BODY_MISMATCH = ("merkle root does not match", "merkle root mutation")
PARENT_INVALID = "its parent is invalid"


def corrupt(e: BlockEntry) -> bool:
    """Refused because its transactions do not match its header: another copy of the same
    block (the same hash) may be the genuine one."""
    return e.status is BlockStatus.INVALID and (e.reason or "").startswith(BODY_MISMATCH)


def keep_block(blobs: BlobStore, block: Block, raw: bytes) -> None:
    """Keep a block's bytes, write-once — except that a copy whose transactions match its header
    replaces a stored copy whose transactions do not (the same hash: a corrupted copy)."""
    key = blob_key(block.hash, "block")
    if blobs.put_if_absent(key, raw) or check_block(block) is not None:
        return
    try:
        stored: Block | None = parse_block(blobs.get(key))
    except ParseError:
        stored = None
    if stored is None or check_block(stored) is not None:
        blobs.delete(key)
        blobs.put_if_absent(key, raw)


class BlockMissing(StorageError):
    """A block's bytes are not in the blob store (a message naming a block never stored)."""


class ChainBusy(Exception):
    """Another worker holds the chain's lease: it applies the chain; try again shortly."""


def check_block(block: Block) -> str | None:
    """The reason a block is invalid on its own (before any transaction is applied), or None."""
    if not check_pow(block.header):
        return "proof of work does not meet its bits"
    if not block.txs:
        return "no transactions"
    root, mutated = block.computed_merkle_root()
    if root != block.header.merkle_root:
        return "merkle root does not match its transactions"
    if mutated:
        return "merkle root mutation: a duplicated last pair of transactions (CVE-2012-2459)"
    seen: set[bytes] = set()
    for t in block.txs:
        if t.txid in seen:
            return f"repeats tx {t.txid_hex}"
        seen.add(t.txid)
    if not block.txs[0].is_coinbase:
        return "its first transaction is not a coinbase"
    extra = next((t for t in block.txs[1:] if t.is_coinbase), None)
    if extra is not None:
        return f"tx {extra.txid_hex} is a second coinbase"
    return None


class Sequencer:
    def __init__(
        self,
        utxo: UtxoStore,
        state: StateStore,
        blobs: BlobStore,
        *,
        allow_missing_inputs: bool = False,
        lease_s: float = 120.0,
        chunk_txs: int = 1000,
        fanout: Fanout | None = None,
    ) -> None:
        self.utxo = utxo
        self.state = state
        self.blobs = blobs
        self.applier = BlockApplier(utxo, allow_missing_inputs=allow_missing_inputs, chunk=chunk_txs,
                                    fanout=fanout or LocalFanout())
        self.lease_s = lease_s
        self.holder = holder_id(f"{id(self):x}")
        self._parsed: OrderedDict[bytes, Block] = OrderedDict()

    # -- arrival -------------------------------------------------------------------------------
    def store_block(self, raw: bytes) -> Block:
        """Parse a block's framing (ParseError when it is not a block) and keep its bytes."""
        block = parse_block(raw)
        keep_block(self.blobs, block, raw)
        self._keep_parsed(block)
        return block

    def submit(self, raw: bytes) -> BlockEntry:
        """Store, accept and apply what can be applied (in this process)."""
        block = self.store_block(raw)
        while self.accept(block) is None:
            time.sleep(0.05)
        while True:
            try:
                self.advance()
                break
            except ChainBusy:
                time.sleep(0.05)
        entry = self.state.get_block(block.hash)
        assert entry is not None
        return entry

    def accept(self, block: Block) -> BlockEntry | None:
        """Put the block into the index: checked on its own, placed after its parent, or held as
        an orphan. Known blocks are left as they are. One worker at a time indexes (the `index`
        lease: the base and an orphan's parent are decided against a stable index); None when
        another is at it — try again."""
        known = self.state.get_block(block.hash)
        if known is not None and not (corrupt(known) and self._check(block) is None):
            return known
        with self.lease(INDEX_LEASE, 30.0) as mine:
            if not mine:
                return None
            if known is not None:
                return self._revive(block, known)
            return self._accept(block)

    def _revive(self, block: Block, known: BlockEntry) -> BlockEntry:
        """The genuine block after a corrupted copy of it was indexed as invalid (its header
        hash is the same): index it as it is, and the descendants refused for its sake too."""
        parent = self.state.get_block(block.header.prev_hash)
        if parent is None or parent.work is None or parent.height is None or parent.status in (
            BlockStatus.INVALID, BlockStatus.ORPHAN
        ):
            return known  # its place is decided when its parent is (the corrupt verdict stays)
        work = parent.work + block_work(block.header.bits)
        self.state.update_block(block.hash, status=self._connected_status(work), reason="",
                                height=parent.height + 1, work=work)
        log.warning("block %s: a valid copy replaces the corrupted one indexed before", block.hash_hex)
        todo = [self._entry(block.hash)]
        while todo:
            p = todo.pop()
            assert p.work is not None and p.height is not None
            for kid in self.state.children(p.hash):
                if kid.status is BlockStatus.INVALID and kid.reason == PARENT_INVALID:
                    w = p.work + block_work(self.load(kid.hash).header.bits)
                    self.state.update_block(kid.hash, status=self._connected_status(w), reason="",
                                            height=p.height + 1, work=w)
                    todo.append(self._entry(kid.hash))
        return self._entry(block.hash)

    def _accept(self, block: Block) -> BlockEntry:
        known = self.state.get_block(block.hash)
        if known is not None:
            return known
        self._init_from_snapshot()
        parent = self.state.get_block(block.header.prev_hash)
        reason = self._check(block)
        n = len(block.txs)
        h = block.hash
        if parent is None:
            base = self._base_child(block)
            if base is not None and not reason:
                return self._rebase(block, base)
            if self.state.best_candidate() is None:  # no chain yet (invalid blocks do not count)
                height = self._base_height(block)
                status = BlockStatus.INVALID if reason else BlockStatus.PENDING
                # bits no target can meet fail check_pow: no work (block_work would raise)
                work = 0 if reason else block_work(block.header.bits)
                entry = self.state.add_block(h, block.header.prev_hash, height, work, status, n, reason)
            else:
                status = BlockStatus.INVALID if reason else BlockStatus.ORPHAN
                entry = self.state.add_block(h, block.header.prev_hash, None, None, status, n, reason)
        elif parent.status is BlockStatus.INVALID:
            entry = self.state.add_block(h, parent.hash, _plus(parent.height), None, BlockStatus.INVALID, n,
                                         reason or PARENT_INVALID)
        elif parent.status is BlockStatus.ORPHAN:
            status = BlockStatus.INVALID if reason else BlockStatus.ORPHAN
            entry = self.state.add_block(h, parent.hash, None, None, status, n, reason)
        else:
            assert parent.height is not None and parent.work is not None
            work = parent.work + (0 if reason else block_work(block.header.bits))
            status = BlockStatus.INVALID if reason else self._connected_status(work)
            entry = self.state.add_block(h, parent.hash, parent.height + 1, work, status, n, reason)
        if entry.status is BlockStatus.INVALID:
            log.warning("block %s is invalid: %s", block.hash_hex, entry.reason)
            self._invalidate_orphans(entry)
        elif entry.status is not BlockStatus.ORPHAN:
            self._connect_orphans(entry)
        return entry

    def _invalidate_orphans(self, parent: BlockEntry) -> None:
        """Orphans that were waiting for a block now known invalid are invalid too. Only
        orphans: a connected child has another parent copy's hash behind it and stays."""
        todo = [parent]
        while todo:
            p = todo.pop()
            for kid in self.state.children(p.hash):
                if kid.status is BlockStatus.ORPHAN:
                    self.state.update_block(
                        kid.hash, status=BlockStatus.INVALID, reason=PARENT_INVALID
                    )
                    todo.append(kid)

    def _connected_status(self, work: int) -> BlockStatus:
        """A new connected block is `pending` while it may become the best chain's, else `side`."""
        tip = self.state.tip()
        return BlockStatus.PENDING if tip is None or tip.work is None or work > tip.work else BlockStatus.SIDE

    def _base_child(self, block: Block) -> BlockEntry | None:
        """The current base, if it is this block's child: the base's parent arrived late."""
        for kid in self.state.children(block.hash):
            if kid.height is not None and kid.status is not BlockStatus.ORPHAN and kid.reason != SNAPSHOT:
                return kid
        return None

    def _rebase(self, block: Block, base: BlockEntry) -> BlockEntry:
        """Blocks were indexed out of order at the start of the chain: `block` is the parent of
        the block taken as the base. It becomes the base, at the height the base rule gives it
        (a genesis child is 1, a BIP34 block its height; else one below the old base, or 0);
        every block above gains its work and moves to its new height; and what was applied is
        taken back whole (its records were made at the old heights: coinbase maturity), so
        that the chain is applied again from the new base, in order."""
        with self.lease(LEASE) as mine:
            if not mine:
                raise StorageError("the chain is being applied; the block is indexed on a retry")
            tip = self.state.tip()
            while tip is not None:
                self._take_back(tip)
                tip = self.state.tip()
            assert base.height is not None
            rule = self._base_height(block)
            height = rule if rule > 0 or base.height == 0 else base.height - 1
            shift = height + 1 - base.height
            work = block_work(block.header.bits)
            entry = self.state.add_block(block.hash, block.header.prev_hash, height, work,
                                         BlockStatus.PENDING, len(block.txs))
            todo = [base]
            while todo:
                e = todo.pop()
                if e.work is not None:
                    assert e.height is not None
                    self.state.update_block(e.hash, work=e.work + work, height=e.height + shift)
                todo += [k for k in self.state.children(e.hash) if k.work is not None]
            log.warning("block %s arrived after its child: it is the chain's base now (height %d)",
                        block.hash_hex, height)
            return entry

    def _take_back(self, e: BlockEntry) -> None:
        """Take an applied block back whole, by its undo record (its new records deleted, its
        spends cleared), as if it had never been applied; the tip goes to its parent."""
        undo = self.state.get_undo(e.hash)
        if undo is None:  # no record of what it made: only unset its mining
            self._disconnect(e)
            return
        self.applier.rollback(self.load(e.hash), undo)
        self.state.delete_undo(e.hash)
        self.state.update_block(e.hash, status=BlockStatus.SIDE)
        self.state.set_tip(e.parent if self.state.get_block(e.parent) else None)

    def _base_height(self, block: Block) -> int:
        if block.header.prev_hash in GENESIS:
            return 1
        return bip34_height(block) or 0

    def _init_from_snapshot(self) -> None:
        """A store seeded with a snapshot at block B (height H): B is the applied base."""
        if not self.state.is_empty():
            return
        snap = self.utxo.snapshot_block()
        if snap is None:
            return
        height, h = snap
        self.state.add_block(h, b"\x00" * 32, height, 0, BlockStatus.APPLIED, 0, SNAPSHOT)
        self.state.set_tip(h)

    def _connect_orphans(self, parent: BlockEntry) -> None:
        """Orphans waiting for `parent` now have a place (and so do theirs)."""
        todo = [parent]
        while todo:
            p = todo.pop()
            for kid in self.state.children(p.hash):
                if kid.status is not BlockStatus.ORPHAN:
                    continue
                assert p.height is not None and p.work is not None
                work = p.work + block_work(self.load(kid.hash).header.bits)
                self.state.update_block(kid.hash, status=self._connected_status(work), height=p.height + 1,
                                        work=work)
                todo.append(self._entry(kid.hash))

    # -- the best chain --------------------------------------------------------------------------
    @contextmanager
    def lease(self, name: str = LEASE, ttl_s: float | None = None) -> Iterator[bool]:
        """Hold the lease `name` while inside (yields False when another worker holds it; one
        that lapsed, or whose holder is a dead process of this host, is taken: `stores.lease`)."""
        got = self.state.acquire_lease(name, self.holder, ttl_s or self.lease_s)
        try:
            yield got
        finally:
            if got:
                self.state.release_lease(name, self.holder)

    def advance(self) -> BlockEntry | None:
        """Apply the best chain up to its tip, reorganising if a heavier branch appeared.
        Returns the tip (None: nothing applied yet); raises ChainBusy at once when another
        worker holds the chain."""
        with self.lease() as mine:
            if not mine:
                raise ChainBusy()
            self._take_back_unfinished()
            while True:
                best = self.state.best_candidate()
                tip = self.state.tip()
                if best is None or (tip is not None and best.hash == tip.hash):
                    return tip
                down, up = self._path(tip, best)
                for e in down:
                    self._disconnect(e)
                for e in up:
                    self.state.acquire_lease(LEASE, self.holder, self.lease_s)  # renew per block
                    if not self._apply(e):
                        break  # refused: the best chain is another one now

    def _path(self, tip: BlockEntry | None, best: BlockEntry) -> tuple[list[BlockEntry], list[BlockEntry]]:
        """(applied blocks to disconnect, tip first; blocks to apply, lowest first)."""
        up: list[BlockEntry] = []
        down: list[BlockEntry] = []
        a: BlockEntry | None = tip
        b: BlockEntry | None = best
        while b is not None and b.status is not BlockStatus.APPLIED:
            up.append(b)
            b = self.state.get_block(b.parent)
        # b is the fork point: the highest applied ancestor of best (applied blocks form one
        # chain, from the base to the tip); None when best's branch has nothing applied.
        while a is not None and (b is None or a.hash != b.hash):
            down.append(a)
            a = self.state.get_block(a.parent)
        up.reverse()
        return down, up

    def _take_back_unfinished(self) -> None:
        """A worker died while applying a block (the `applying` mark names it): take back what
        it did before anything else, whether or not that block is still on the best chain."""
        h = self.state.get_meta(APPLYING)
        if h is None:
            return
        block_hash = bytes.fromhex(h)
        undo = self.state.get_undo(block_hash)
        if undo is not None and undo.get("state") == "applying":
            log.warning("taking back block %s, left half applied", block_hash[::-1].hex())
            settle_block(self.state, block_hash, self.lease_s)  # its units: none may still write
            self.applier.rollback(self.load(block_hash), undo)
            self.state.delete_undo(block_hash)
        self.state.set_meta(APPLYING, None)

    def _apply(self, e: BlockEntry) -> bool:
        assert e.height is not None
        block = self.load(e.hash)
        undo = self.state.get_undo(e.hash)
        if undo is not None and undo.get("state") == "applying":
            settle_block(self.state, e.hash, self.lease_s)
            self.applier.rollback(block, undo)  # left half applied (without its mark): start over
        undo = self.applier.plan(block) | {"state": "applying", "block_id": e.block_id, "height": e.height}
        self.state.put_undo(e.hash, undo)
        self.state.set_meta(APPLYING, e.hash.hex())
        t0 = time.perf_counter()
        self.applier.heartbeat = self._renewer()
        try:
            counts = self.applier.apply(
                block, e.height, e.block_id, undo, lambda u: self.state.put_undo(e.hash, u)
            )
        except BlockRefused as r:
            self.state.delete_undo(e.hash)
            self.state.set_meta(APPLYING, None)
            self._invalidate(e, r.reason)
            return False
        finally:
            self.applier.heartbeat = _no_beat
        self.state.put_undo(e.hash, undo | {"state": "applied"})
        self.state.update_block(e.hash, status=BlockStatus.APPLIED)
        self.state.set_tip(e.hash)
        self.state.set_meta(APPLYING, None)
        log.info("applied block %s at height %d: %s in %.2f s", block.hash_hex, e.height, counts,
                 time.perf_counter() - t0)
        return True

    def _renewer(self) -> Callable[[], None]:
        """Renews the chain lease at most every quarter of its TTL while a block is applied
        (a phase may outlast the lease); StorageError when another worker has taken it."""
        last = time.monotonic()

        def renew() -> None:
            nonlocal last
            if time.monotonic() - last < self.lease_s / 4:
                return
            if not self.state.acquire_lease(LEASE, self.holder, self.lease_s):
                raise StorageError("the chain lease was lost while applying a block: another worker "
                                   "applies the chain now")
            last = time.monotonic()

        return renew

    def _disconnect(self, e: BlockEntry) -> None:
        assert e.height is not None
        block = self.load(e.hash)
        self.applier.disconnect(block, e.height, e.block_id)
        self.state.update_block(e.hash, status=BlockStatus.SIDE)
        self.state.set_tip(e.parent if self.state.get_block(e.parent) else None)
        log.info("disconnected block %s at height %d", block.hash_hex, e.height)

    def _invalidate(self, e: BlockEntry, reason: str) -> None:
        log.warning("block %s is invalid: %s", e.hash[::-1].hex(), reason)
        self.state.update_block(e.hash, status=BlockStatus.INVALID, reason=reason)
        todo = [e.hash]
        while todo:
            for kid in self.state.children(todo.pop()):
                if kid.status is not BlockStatus.INVALID:
                    self.state.update_block(
                        kid.hash, status=BlockStatus.INVALID, reason=PARENT_INVALID
                    )
                    todo.append(kid.hash)

    # -- helpers -------------------------------------------------------------------------------
    def load(self, h: bytes) -> Block:
        """A block's bytes from the blob store, parsed. The last few blocks whose transactions
        match their header are kept parsed (a block is loaded when it arrives, when it is
        applied, and by each helper): such a body is the only one its hash can have, whereas a
        corrupted copy may yet be replaced by the genuine one."""
        b = self._parsed.get(h)
        if b is not None:
            self._parsed.move_to_end(h)
            return b
        b = self._read(h)
        self._keep_parsed(b)
        return b

    def genuine(self, h: bytes) -> Block:
        """`load`, for a block whose transactions match its header only (StorageError else)."""
        b = self.load(h)
        if h not in self._parsed:  # only checked bodies are kept
            raise StorageError(f"the stored copy of block {h[::-1].hex()} does not match its header")
        return b

    def _check(self, b: Block) -> str | None:
        """check_block, but not again for a block this sequencer keeps parsed (only checked
        blocks are kept: `load` and `store_block` checked it already)."""
        return None if self._parsed.get(b.hash) is b else check_block(b)

    def _keep_parsed(self, b: Block) -> None:
        if b.hash not in self._parsed and check_block(b) is None:
            self._parsed[b.hash] = b
            while len(self._parsed) > PARSED_KEPT:
                self._parsed.popitem(last=False)

    def _read(self, h: bytes) -> Block:
        try:
            return parse_block(self.blobs.get(blob_key(h, "block")))
        except BlobNotFound:
            raise BlockMissing(f"block {h[::-1].hex()}: its bytes are not in the blob store") from None
        except ParseError as e:
            raise StorageError(f"block {h[::-1].hex()} in the blob store does not parse: {e}") from e

    def _entry(self, h: bytes) -> BlockEntry:
        e = self.state.get_block(h)
        assert e is not None
        return e


def _no_beat() -> None:
    pass


def _plus(h: int | None) -> int | None:
    return None if h is None else h + 1
