"""The block index: which blocks are known, where each stands (its parent, height, cumulative work,
status), and which block the chain starts from. It decides nothing about the UTXO store.

Invariants:
- One worker at a time adds to the index (the `index` lease), so the base and an orphan's parent
  are decided against a stable index.
- A block is checked on its own when it arrives (`chain.check_block`); a block whose parent is
  invalid is invalid; one whose parent is unknown or an orphan is an orphan; any other is
  connected: its height and work follow from its parent's, and it is `pending` while it may
  become the best chain's, else `side`.
- The base is the root of the connected blocks: the first block whose parent is unknown while
  the chain is empty (its BIP34 height, else 0; 1 for a child of a well-known genesis), or the
  block a UTXO snapshot was taken at. Whenever a block arrives that makes the base's parent known
  — directly, or through orphans — the root of that ancestry is to be the base: a rebase is
  noted (meta `rebase`), and the chain's holder carries it out (`Sequencer`): whatever the
  arrival order, the chain found is the one an ordered pass finds. A block refused for spending
  outputs no block seen made, while the base's parent is unknown, is placed again when a block
  arrives below it (`provisional`): the outputs may be in that block's ancestry.
- Every walk over descendants is `descend`, breadth first, each block once.
- What indexing needs of a block is its `Arrival` (header links and bits, transaction count, the
  height it states, its own check): a worker's block task builds it from the parsed block, and
  `utxo enqueue` from the block it checked at the door (`accept_checked`), so that a file's
  chain is in the index before the first of its messages is taken, and the chain's holder
  finds it ready to apply in batches.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from chain import (
    BODY_MISMATCH,
    Block,
    ParseError,
    bip34_height,
    block_work,
    check_block,
    hex_to_hash,
    parse_block,
)
from stores.blob.protocol import BlobNotFound, BlobStore, blob_key
from stores.errors import StorageError
from stores.state import BlockChange, BlockEntry, BlockStatus, StateStore
from stores.utxo.gcpause import gc_paused
from workers.ops import metrics

log = logging.getLogger("utxoflow.index")

GENESIS = {
    hex_to_hash(h)
    for h in (
        "000000000019d6689c085ae165831e934ff763ae46a2a6c172b3f1b60a8ce26f",  # mainnet
        "000000000933ea01ad0ee984209779baaec3ced90fa3f408719526f8d77f4943",  # testnet
        "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206",  # regtest
    )
}
INDEX_LEASE = "index"
BASE = "base"  # state meta: the hash of the chain's base block
REBASE = "rebase"  # state meta: the block that is to become the base (carried out by the chain)
SNAPSHOT = "UTXO snapshot"  # the reason field of a snapshot's base block (it has no bytes)
PARENT_INVALID = "its parent is invalid"
# the end of a refusal's reason that an earlier block may undo (see `provisional`)
START_UNKNOWN = "(the chain's start is not known yet: placed again if an earlier block arrives)"
# Parsed blocks kept per process: enough for a burst of blocks indexed ahead of the chain, so
# that each is parsed once per process. Memory is estimated (`parsed_bytes`); the count bounds
# the work of choosing which block goes.
PARSED_KEPT_BYTES = 64 << 20
PARSED_KEPT_BLOCKS = 256


def parsed_bytes(b: Block) -> int:
    """About what a parsed block holds in memory: its bytes twice (each transaction's and its
    scripts are copies) and ~800 bytes of objects per transaction (measured: 2.3 MB for a
    block of 2,000 2-in/2-out transactions, 324 kB raw)."""
    return 2 * b.size + 800 * len(b.txs)


# A parsed block is tens of thousands of objects without cycles: the collector running over them
# as they are made (and over the blocks kept) costs ~40% of a parse for nothing.
parse_block_fast = gc_paused(parse_block)


UNREADABLE = "the stored copy"  # a `CorruptBlock`'s reason: the bytes the blob store holds are bad


def corrupt(e: BlockEntry) -> bool:
    """Refused because its transactions do not match its header, or its stored bytes do not
    parse (`CorruptBlock`): another copy of the same block (the same hash) may be the genuine
    one, and `utxo enqueue` of it replaces the bad one."""
    return e.status is BlockStatus.INVALID and (e.reason or "").startswith((*BODY_MISMATCH, UNREADABLE))


def keep_block(blobs: BlobStore, block_hash: bytes, raw: bytes, block: Block | None = None) -> None:
    """Keep a block's bytes (`raw`, which parse to a block of hash `block_hash`; `block`: them
    parsed, if at hand), write-once — except that a copy whose transactions match its header
    replaces a stored copy whose transactions do not (the same hash: a corrupted copy)."""
    key = blob_key(block_hash, "block")
    if blobs.put_if_absent(key, raw):
        return
    if check_block(block if block is not None else parse_block(raw)) is not None:
        return
    try:
        stored: Block | None = parse_block(blobs.get(key))
    except (ParseError, BlobNotFound):
        stored = None
    if stored is None or check_block(stored) is not None:
        blobs.delete(key)
        blobs.put_if_absent(key, raw)


class CorruptBlock(StorageError):
    """The bytes the blob store holds for a block do not parse, or are not that block: trying
    again reads the same bytes. The block is refused as corrupt (`corrupt`) until a good copy
    is enqueued."""

    def __init__(self, block_hash: bytes, why: str) -> None:
        super().__init__(f"{UNREADABLE} of block {block_hash[::-1].hex()} {why}: enqueue the block again")
        self.block_hash = block_hash


class BlockMissing(StorageError):
    """A block's bytes are not in the blob store (a message naming a block never stored)."""

    def __init__(self, block_hash: bytes) -> None:
        super().__init__(f"block {block_hash[::-1].hex()}: its bytes are not in the blob store")
        self.block_hash = block_hash


class Blocks:
    """Blocks by hash from the blob store, those whose transactions match their header kept
    parsed (up to `kept_bytes` estimated and `kept_blocks`): such a body is the only one its hash can have,
    whereas a corrupted copy may yet be replaced by the genuine one.

    Past the budget, a block the chain has passed goes first (`passed`), else the least
    recently used; never the block being kept. Of blocks with a BIP34 height: while this
    worker applies the chain, the one furthest ahead goes (needed last). While another worker
    holds the chain (`ahead`: this one only indexes), the lowest goes instead: the holder
    applies those before this worker can take the chain over, so a burst longer than the
    budget is parsed again only for what the holder had not reached by then (keeping the
    lowest would parse again everything past the budget)."""

    def __init__(self, blobs: BlobStore, kept_bytes: int = PARSED_KEPT_BYTES,
                 kept_blocks: int = PARSED_KEPT_BLOCKS) -> None:
        self.blobs = blobs
        self.kept_bytes = kept_bytes
        self.kept_blocks = kept_blocks
        self._parsed: OrderedDict[bytes, Block] = OrderedDict()
        self._heights: dict[bytes, int | None] = {}
        self._bytes = 0  # parsed_bytes of the blocks in _parsed
        self.floor = 0  # blocks below this height are applied: the first to go
        self.ahead = False  # another worker holds the chain: this one indexes ahead of it
        self.parses = 0  # blocks parsed by this object (bench.pipeline counts them in the log)

    def passed(self, height: int) -> None:
        """The chain has applied every block below `height` (this worker saw it do so)."""
        self.floor = max(self.floor, height)

    def _parse(self, raw: bytes) -> Block:
        t0 = time.perf_counter()
        block = parse_block_fast(raw)
        self.parses += 1
        log.info("parsed block %s (%d txs) in %.1f ms", block.hash_hex, len(block.txs),
                 (time.perf_counter() - t0) * 1000)
        return block

    def store(self, raw: bytes) -> Block:
        """Parse a block's framing (ParseError when it is not a block) and keep its bytes."""
        block = self._parse(raw)
        keep_block(self.blobs, block.hash, raw, block)
        self.keep(block)
        return block

    def load(self, h: bytes) -> Block:
        b = self._parsed.get(h)
        if b is not None:
            self._parsed.move_to_end(h)
            return b
        try:
            b = self._parse(self.blobs.get(blob_key(h, "block")))
        except BlobNotFound:
            raise BlockMissing(h) from None
        except ParseError as e:
            raise CorruptBlock(h, f"does not parse ({e})") from e
        self.keep(b)
        return b

    def genuine(self, h: bytes) -> Block:
        """`load`, for a block whose transactions match its header only (CorruptBlock else)."""
        b = self.load(h)
        if h not in self._parsed:  # only checked bodies are kept
            raise CorruptBlock(h, "does not match its header")
        return b

    def check(self, b: Block) -> str | None:
        """check_block, but not again for a block kept parsed (only checked ones are)."""
        return None if self._parsed.get(b.hash) is b else check_block(b)

    def keep(self, b: Block) -> None:
        """Keep a checked block parsed, others going past the budget (see above)."""
        if b.hash not in self._parsed and check_block(b) is None:
            self._parsed[b.hash] = b
            self._heights[b.hash] = bip34_height(b)
            self._bytes += parsed_bytes(b)
            while len(self._parsed) > 1 and (
                self._bytes > self.kept_bytes or len(self._parsed) > self.kept_blocks
            ):
                gone = self._victim(b.hash)
                self._bytes -= parsed_bytes(self._parsed.pop(gone))
                del self._heights[gone]

    def _victim(self, keeping: bytes) -> bytes:
        others = [h for h in self._parsed if h != keeping]  # least recently used first
        known = [(x, h) for h in others if (x := self._heights[h]) is not None]
        passed = [h for x, h in known if x < self.floor]
        if passed:
            return passed[0]
        if not known:
            return others[0]
        return min(known)[1] if self.ahead else max(known)[1]


def seed_from_snapshot(state: StateStore, snap: tuple[int, bytes] | None) -> None:
    """A state store that knows no block yet, beside a UTXO store seeded with a snapshot at block
    B (height H, `snap`): B becomes the applied base and the tip. Idempotent (`add_block` finds
    B if it is there): `utxo import-utxos` does it at once, the index on its first block."""
    if snap is None or not state.is_empty():
        return
    height, h = snap
    state.add_block(h, b"\x00" * 32, height, 0, BlockStatus.APPLIED, 0, SNAPSHOT)
    state.commit(tip=h, meta={BASE: h.hex()})


def stated_height(block: Block) -> int | None:
    """The height a block tells by itself: 1 after a well-known genesis, else its BIP34 height
    (None: it tells none)."""
    if block.header.prev_hash in GENESIS:
        return 1
    return bip34_height(block)


def base_height(block: Block) -> int:
    """The height of a block that starts the chain: its stated height, else 0."""
    return stated_height(block) or 0


def below_snapshot(height: int | None, block_hash: bytes, snapshot: tuple[int, bytes]) -> bool:
    """Whether a block at `height` can never join a chain started from a UTXO snapshot taken at
    `snapshot` (height H, hash B): it stands at H or below and is not B (the chain holds nothing
    below B, and the snapshot holds B's outputs). It would wait as an orphan for ever."""
    return height is not None and height <= snapshot[0] and block_hash != snapshot[1]


Lease = Callable[[str, float], AbstractContextManager[bool]]


@dataclass(frozen=True, slots=True)
class Arrival:
    """What the index takes of an arriving block: its hash, its parent's, its bits, how many
    transactions it holds, the height it states (`stated_height`), and why it is invalid on its
    own (`check`: called at most once, only when the block is new to the index)."""

    hash: bytes
    prev: bytes
    bits: int
    n_txs: int
    stated: int | None
    check: Callable[[], str | None]

    @property
    def hash_hex(self) -> str:
        return self.hash[::-1].hex()

    @property
    def base_height(self) -> int:
        """The height it has if it starts the chain (`base_height`)."""
        return self.stated or 0


class BlockIndex:
    def __init__(
        self,
        state: StateStore,
        blocks: Blocks,
        lease: Lease,
        snapshot_block: Callable[[], tuple[int, bytes] | None] = lambda: None,
    ) -> None:
        """`lease(name, ttl_s)` holds a named lease while inside (False: another holds it);
        `snapshot_block` names the block a UTXO snapshot was taken at, if any."""
        self.state = state
        self.blocks = blocks
        self.lease = lease
        self.snapshot_block = snapshot_block

    # -- walks -----------------------------------------------------------------------------------
    def descend(self, root: BlockEntry, step: Callable[[BlockEntry, BlockEntry], BlockEntry | None]) -> None:
        """Walk `root`'s descendants breadth first: `step(child, its parent as walked)` returns
        the child as it now stands to walk on from it, or None to stop below it."""
        todo = [root]
        while todo:
            parent = todo.pop(0)
            for kid in self.state.children(parent.hash):
                now = step(kid, parent)
                if now is not None:
                    todo.append(now)

    def derived(self, kid: BlockEntry, parent: BlockEntry, tip_work: int | None) -> BlockChange:
        """Where `kid` stands below `parent` as `parent` now stands: invalid after an invalid
        parent, an orphan below an orphan, else connected (its height and work from the
        parent's). A block invalid on its own stays so."""
        if kid.status is BlockStatus.INVALID and kid.reason != PARENT_INVALID and not provisional(kid):
            return BlockChange(kid.hash)
        if parent.status is BlockStatus.INVALID:
            return BlockChange(kid.hash, status=BlockStatus.INVALID, reason=PARENT_INVALID)
        if parent.status is BlockStatus.ORPHAN or parent.work is None or parent.height is None:
            return BlockChange(kid.hash, status=BlockStatus.ORPHAN)
        work = parent.work + block_work(self.blocks.load(kid.hash).header.bits)
        keep = kid.status in (BlockStatus.APPLIED, BlockStatus.SIDE) and kid.work == work
        status = kid.status if keep else connected_status(work, tip_work)
        return BlockChange(kid.hash, status=status, reason="", height=parent.height + 1, work=work)

    def rederive(
        self, root: BlockEntry, only: Callable[[BlockEntry], bool] = lambda e: True
    ) -> list[BlockChange]:
        """The changes that put every descendant of `root` (those `only` accepts, and theirs)
        where `root` as it now stands places them."""
        tip = self.state.tip()
        tip_work = None if tip is None else tip.work
        changes: list[BlockChange] = []

        def step(kid: BlockEntry, parent: BlockEntry) -> BlockEntry | None:
            if not only(kid):
                return None
            c = self.derived(kid, parent, tip_work)
            changes.append(c)
            return _with(kid, c)

        self.descend(root, step)
        return changes

    def reconsidered(self, root: BlockEntry) -> list[BlockChange]:
        """The changes that clear `root`, an invalid block whose parent is not, and every invalid
        descendant of it, of their verdicts (an operator's `utxo reconsider`, as Bitcoin Core's
        reconsiderblock), each placed again below its parent as it then stands; a block whose
        own bytes fail their checks is invalid again, for that reason, and its descendants for
        its sake. BlockMissing when a body is not in the blob store (nothing changed)."""
        parent = self.state.get_block(root.parent)
        if parent is None:
            raise ValueError(f"the parent of block {root.hash[::-1].hex()} is not known: nothing to "
                             "place it below")
        tip = self.state.tip()
        tip_work = None if tip is None else tip.work
        changes: list[BlockChange] = []

        def place(kid: BlockEntry, parent: BlockEntry) -> BlockEntry | None:
            if kid.status is not BlockStatus.INVALID:
                return None  # (none is: a descendant of an invalid block is invalid)
            reason = check_block(self.blocks.load(kid.hash))  # (load: checked ones are kept)
            if reason and parent.status is not BlockStatus.INVALID:
                c = BlockChange(kid.hash, status=BlockStatus.INVALID, reason=reason)
            else:
                cleared = _with(kid, BlockChange(kid.hash, status=BlockStatus.ORPHAN))
                c = self.derived(cleared, parent, tip_work)
            changes.append(c)
            return _with(kid, c)

        now = place(root, parent)
        if now is not None:
            self.descend(now, place)
        return changes

    # -- arrival ---------------------------------------------------------------------------------
    def accept(self, block: Block) -> BlockEntry | None:
        """Put the block into the index (see the invariants). Known blocks are left as they are,
        but a genuine copy revives a corrupted one. None when another worker is indexing."""
        h = block.header
        return self._accept(Arrival(block.hash, h.prev_hash, h.bits, len(block.txs), stated_height(block),
                                    lambda: self.blocks.check(block)))

    def accept_checked(
        self, block_hash: bytes, prev: bytes, bits: int, n_txs: int, stated: int | None
    ) -> BlockEntry | None:
        """`accept` for a block whose transactions were checked against its header already (at
        `utxo enqueue`'s door: `chain.check_block`), from its header's fields alone."""
        return self._accept(Arrival(block_hash, prev, bits, n_txs, stated, lambda: None))

    def _accept(self, a: Arrival) -> BlockEntry | None:
        known = self.state.get_block(a.hash)
        if known is not None and not (corrupt(known) and a.check() is None):
            self.heal(known)
            return known
        with self.lease(INDEX_LEASE, 30.0) as mine:
            if not mine:
                return None
            known = self.state.get_block(a.hash)
            if known is not None and not corrupt(known):
                return known
            entry = self._revive(a, known) if known is not None else self._add(a)
            self._note_rebase()
            return entry

    def heal(self, known: BlockEntry) -> None:
        """Place again the orphans left under `known`, if it is no longer an orphan and has
        any: its own commit and its descendants' are two, and a worker that died between them
        left them so (a redelivery of its message, or the block enqueued again, comes here)."""
        if known.status is BlockStatus.ORPHAN or not stranded(self.state, known):
            return
        with self.lease(INDEX_LEASE, 30.0) as mine:
            if not mine:
                return  # whoever indexes now places them, or the next delivery does
            now = self.state.get_block(known.hash)
            if now is None:
                return
            below = self._place_below(now)
            if below:
                log.warning("block %s: %d descendant(s) left as orphans placed again", now.hash[::-1].hex(),
                            len(below))

    def _add(self, a: Arrival) -> BlockEntry:
        self._init_from_snapshot()
        parent = self.state.get_block(a.prev)
        reason = a.check()
        n, h, prev = a.n_txs, a.hash, a.prev
        if parent is None:
            if self.state.best_candidate() is None:  # no chain yet (invalid blocks do not count)
                # bits no target can meet fail check_pow: no work (block_work would raise)
                work = 0 if reason else block_work(a.bits)
                status = BlockStatus.INVALID if reason else BlockStatus.PENDING
                entry = self.state.add_block(h, prev, a.base_height, work, status, n, reason)
                if not reason:
                    self.state.set_meta(BASE, h.hex())
            else:
                status = BlockStatus.INVALID if reason else BlockStatus.ORPHAN
                entry = self.state.add_block(h, prev, None, None, status, n, reason)
        elif parent.status is BlockStatus.INVALID:
            entry = self.state.add_block(
                h, prev, _plus(parent.height), None, BlockStatus.INVALID, n, reason or PARENT_INVALID
            )
        elif parent.status is BlockStatus.ORPHAN:
            status = BlockStatus.INVALID if reason else BlockStatus.ORPHAN
            entry = self.state.add_block(h, prev, None, None, status, n, reason)
        else:
            assert parent.height is not None and parent.work is not None
            work = parent.work + (0 if reason else block_work(a.bits))
            tip = self.state.tip()
            status = (
                BlockStatus.INVALID if reason else connected_status(work, None if tip is None else tip.work)
            )
            entry = self.state.add_block(h, prev, parent.height + 1, work, status, n, reason)
        refused = int(entry.status is BlockStatus.INVALID)
        if refused:
            log.warning("block %s is invalid: %s", a.hash_hex, entry.reason)
            if entry.reason != PARENT_INVALID:  # (its parent's refusal is the one to tell)
                self.state.note_refusal(f"block:{a.hash_hex}", "block", a.hash_hex, entry.reason or "invalid")
        # (a second commit: `heal` finishes it after a crash)
        refused += sum(c.status is BlockStatus.INVALID for c in self._place_below(entry))
        if refused:
            metrics.blocks_refused(refused)
        return entry

    def _place_below(self, entry: BlockEntry) -> list[BlockChange]:
        """The orphans below `entry` (no orphan itself) placed where it places them (invalid, or
        connected now), and those refused only for where they stood placed again: the changes,
        committed."""
        if entry.status is BlockStatus.ORPHAN:
            return []
        below = self.rederive(entry, lambda e: e.status is BlockStatus.ORPHAN or placed_again(e))
        if below:
            self.state.commit(blocks=below)
        return below

    def _revive(self, a: Arrival, known: BlockEntry) -> BlockEntry:
        """The genuine block after a corrupted copy of it was indexed as invalid (the same header
        hash): it takes its place, and the descendants refused for its sake are placed again."""
        parent = self.state.get_block(a.prev)
        if parent is None or parent.status in (BlockStatus.INVALID, BlockStatus.ORPHAN):
            return known  # its place is decided when its parent's is (the corrupt verdict stays)
        tip = self.state.tip()
        change = self.derived(
            _with(known, BlockChange(known.hash, status=BlockStatus.ORPHAN)),
            parent,
            None if tip is None else tip.work,
        )
        entry = _with(known, change)
        changes = [change, *self.rederive(entry, lambda e: e.reason == PARENT_INVALID)]
        self.state.commit(blocks=changes)
        log.warning("block %s: a valid copy replaces the corrupted one indexed before", a.hash_hex)
        return self.entry(a.hash)

    def _init_from_snapshot(self) -> None:
        if self.state.is_empty():
            seed_from_snapshot(self.state, self.snapshot_block())

    # -- the base --------------------------------------------------------------------------------
    def base(self) -> BlockEntry | None:
        b = self.state.get_meta(BASE)
        return None if b is None else self.state.get_block(bytes.fromhex(b))

    def start_known(self) -> bool:
        """Nothing can arrive below the chain's base: it is a snapshot's block, a genesis block,
        or follows a well-known genesis (whose coinbase no one can spend)."""
        base = self.base()
        return base is not None and (
            base.reason == SNAPSHOT or base.parent == b"\x00" * 32 or base.parent in GENESIS
        )

    def rebase_root(self) -> BlockEntry | None:
        """The root of the base's known ancestry, when that is not the base itself: the block
        the chain is to start from (found afresh each time: more ancestors may have arrived
        since a rebase was noted)."""
        base = self.base()
        if base is None or self.start_known():  # (a genesis arriving below it is an orphan)
            return None
        root = base
        for above in self.ancestry(base):
            root = above
        return None if root.hash == base.hash else root

    def _note_rebase(self) -> None:
        """When the base's parent is known now (directly or through orphans), note the root of
        its ancestry as the base to be: the chain's holder carries it out."""
        root = self.rebase_root()
        if root is None or self.state.get_meta(REBASE) == root.hash.hex():
            return
        log.warning(
            "block %s is an ancestor of the base: the chain starts there (a rebase)", root.hash[::-1].hex()
        )
        self.state.set_meta(REBASE, root.hash.hex())

    def ancestry(self, e: BlockEntry) -> Iterator[BlockEntry]:
        """`e`'s ancestors in the index, parent first, as far as they are known."""
        seen = {e.hash}
        p = self.state.get_block(e.parent)
        while p is not None and p.hash not in seen:
            seen.add(p.hash)
            yield p
            p = self.state.get_block(p.parent)

    def entry(self, h: bytes) -> BlockEntry:
        e = self.state.get_block(h)
        assert e is not None
        return e


def stranded(state: StateStore, e: BlockEntry) -> bool:
    """Some child of `e` (a block no longer an orphan) is still an orphan: left so by a
    worker that died between indexing `e` and placing its descendants (`BlockIndex.heal`)."""
    return any(k.status is BlockStatus.ORPHAN for k in state.children(e.hash))


def placed_again(e: BlockEntry) -> bool:
    """Refused for where it stood, not for itself: a block arriving below it places it again."""
    return provisional(e) or (e.status is BlockStatus.INVALID and e.reason == PARENT_INVALID)


def provisional(e: BlockEntry) -> bool:
    """Refused for spending outputs no block seen so far made, while the chain's start was not
    known: an ancestor arriving later places it again."""
    return e.status is BlockStatus.INVALID and (e.reason or "").endswith(START_UNKNOWN)


def connected_status(work: int, tip_work: int | None) -> BlockStatus:
    """A connected block is `pending` while it may become the best chain's, else `side`."""
    return BlockStatus.PENDING if tip_work is None or work > tip_work else BlockStatus.SIDE


def _with(e: BlockEntry, c: BlockChange) -> BlockEntry:
    """`e` with the changes of `c` (the entry as a walk sees it before they are committed)."""
    return BlockEntry(
        e.hash,
        e.parent,
        e.height if c.height is None else c.height,
        e.work if c.work is None else c.work,
        e.status if c.status is None else c.status,
        e.reason if c.reason is None else (c.reason or None),
        e.block_id,
        e.seq,
        e.n_txs,
    )


def _plus(h: int | None) -> int | None:
    return None if h is None else h + 1
