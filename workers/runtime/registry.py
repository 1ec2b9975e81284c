"""What has been enqueued and not yet processed, for `utxo wait` and for re-sending what a broker
lost: the state store's table of pending messages (stores/state/pending.py), which every worker
and client shares and which a restart of the broker cannot touch.

Invariants: an id is added before its message is sent and removed only when its task has
finished for good (done, refused, or given up after its retries), so "none of the ids pending
when I started waiting is pending any more" means everything enqueued by then has been
processed — also when the broker lost its queues meanwhile, since the entries outlive them and
workers/recovery/requeue.py sends their messages again. An id is "<kind>:<key>"; its message is the
task of that kind with the arguments [key, id].

A block's task that finds another worker applying the chain indexes its block and leaves its id
pending (workers/chainstate/sequencer.py: the holder re-checks the best chain before it lets go); the
holder removes the ids of the blocks its passes applied or refused once a pass ends with the
chain at rest (`done_blocks`). An id left otherwise (a block that stayed an orphan; a holder
that died) is removed by `utxo wait` once settled — final (applied, side, invalid, or an orphan
whose parent is not in the index) while the chain is at rest — or sent again by the requeue
scan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from chain import hex_to_hash
from stores.state import PENDING_KINDS, BlockEntry, BlockStatus, PendingDone, Refusal, StateStore
from workers.broker.runs import BrokerRun

FINAL = {"applied", "side", "invalid", "orphan"}  # block statuses no pass of the chain changes
REPORTED = "refusals_reported"  # state meta: the refusal log's last row a `utxo wait` reported
KEEP_REPORTED = 100_000  # refusals one wait reads at most (the log keeps fewer)


def parse_ident(ident: str) -> tuple[str, str]:
    """(kind, key) of a message id (ValueError: not "<kind>:<key>" with a known kind)."""
    kind, sep, key = ident.partition(":")
    if not sep or not key or kind not in PENDING_KINDS:
        raise ValueError(f"a message id is <kind>:<key> with kind one of {PENDING_KINDS}, got {ident!r}")
    return kind, key


class Registry:
    def __init__(self, state: StateStore, broker: BrokerRun | None = None) -> None:
        self.state = state
        self.broker = broker  # None: the run a message goes to is not recorded (taken as unknown)
        self.waited: list[str] = []  # the ids the last `wait` waited for

    def add(self, ident: str) -> None:
        """Register `ident` before its message is sent, with the broker run it is sent under."""
        kind, key = parse_ident(ident)
        self.state.add_pending(ident, kind, key, self.broker.known() if self.broker else "")

    def add_many(self, idents: Sequence[str], kept: Mapping[str, bytes] | None = None) -> None:
        """`add` of each, in one write (a batch of messages about to be sent), with the bytes
        of the transactions among them that travel with their registration (`kept`)."""
        entries = [(ident, *parse_ident(ident)) for ident in idents]
        if entries:
            self.state.add_pending_many(entries, self.broker.known() if self.broker else "", kept)

    def done_many(self, done: Sequence[PendingDone]) -> None:
        """`done` of each, in one write (a batch of transactions finished)."""
        if done:
            self.state.remove_pending_many(done)

    def done(self, ident: str, accepted: bool = False, refused: tuple[str, str | None] | None = None) -> None:
        """`ident`'s task finished for good; `accepted`: its tx's record was made (noted for
        the recovery manager in the same write); `refused`: (why, the rival's txid or None),
        logged in the same write (stores/state/refusals.py)."""
        self.state.remove_pending(ident, accepted, refused)

    def pending(self) -> set[str]:
        return {e.ident for e in self.state.pending()}

    def waits(self, reasons: Sequence[tuple[str, str]]) -> None:
        """Why these pending ids wait (ident, reason): `utxo wait` and `utxo tx` say it."""
        self.state.note_waiting(reasons)

    def done_blocks(self, hashes: list[bytes]) -> None:
        """The ids of these blocks, settled by a pass of the chain that ended at rest."""
        for h in hashes:
            self.done(f"block:{h[::-1].hex()}")

    def wait(
        self,
        timeout: float,
        poll: float = 0.05,
        settled: Callable[[list[str]], list[str]] | None = None,
        settle_every: float = 1.0,
        progress: Callable[[list[str]], None] | None = None,
    ) -> bool:
        """True once none of the ids pending now is pending any more; False on timeout. The ids
        that `settled` picks of those waited for are done anyway (a block another worker applied
        while the message's own worker died) and are taken off the registry: asked at once, then
        every `settle_every` seconds (it reads the chain's state), while the registry itself is
        read every `poll` seconds (one indexed read: a wait returns soon after the work is done).
        `progress` is told the ids still waited for at every read (first: all of them)."""
        now = self.state.pending()
        self.waited = [e.ident for e in now]
        if progress is not None:
            progress([e.ident for e in now])
        if not now:
            return True
        upto = now[-1].seq  # ids registered later (or removed and added again) are not waited for
        deadline = time.monotonic() + timeout
        settle_at = time.monotonic()  # at once, then every `settle_every` seconds
        while True:
            waiting = [e.ident for e in self.state.pending(upto)]
            if settled is not None and waiting and time.monotonic() >= settle_at:
                for w in settled(list(waiting)):
                    self.done(w)
                    waiting.remove(w)
                settle_at = time.monotonic() + settle_every
            if progress is not None:
                progress(waiting)
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


    def unreported(self, also: Sequence[str] = ()) -> tuple[list[Refusal], int]:
        """The refusals no `utxo wait` has reported yet (the log's rows past the REPORTED mark:
        a message refused before a wait began is reported all the same), with those of `also`
        (ids waited for) the log does not hold; and the mark to move to once they are."""
        mark = int(self.state.get_meta(REPORTED) or 0)
        logged = self.state.refusals_since(mark, limit=KEEP_REPORTED)
        seen = {r.ident for r in logged}
        extra = [r for r in self.refused([i for i in also if i not in seen]) if r.ident not in seen]
        return [*logged, *extra], max([mark, *(r.seq for r in logged)])

    def reported(self, mark: int) -> None:
        self.state.set_meta(REPORTED, str(mark))

    def orphans(self, limit: int = 20) -> tuple[int, list[BlockEntry]]:
        """How many blocks of the index wait as orphans (their parent never arrived), and the
        last `limit` of them."""
        n = self.state.block_summary().get(BlockStatus.ORPHAN.value, (0, None))[0]
        return n, self.state.last_blocks(BlockStatus.ORPHAN, limit) if n else []

    def refused(self, idents: Sequence[str]) -> list[Refusal]:
        """Those of `idents` (finished) that were refused, in their order: transactions from the
        refusal log, blocks from their status in the index (the reason kept there)."""
        logged = self.state.refusals([i for i in idents if i.startswith("tx:")])
        out: list[Refusal] = []
        for ident in idents:
            if ident in logged:
                out.append(logged[ident])
            elif ident.startswith("block:"):
                key = ident.partition(":")[2]
                try:
                    e = self.state.get_block(hex_to_hash(key))
                except ValueError:
                    continue
                if e is not None and e.status is BlockStatus.INVALID:
                    out.append(Refusal(ident, "block", key, e.reason or "invalid", None, 0.0, 0))
        return out


class BlockSettled:
    """Of the pending ids given, those done anyway: blocks that are final while the chain is at
    rest. A block applied while a pass is still running (which may yet disconnect it, or apply
    the orphans it connected) is not settled yet; nor is anything but a block. The chain's rest
    is read once for all of them, after their statuses (so a pass that made one final had
    ended). `final` keeps the ids found final at the last call, at rest or not: `utxo wait`
    counts them done in its progress, as the tip passes them."""

    def __init__(self, state: StateStore) -> None:
        self.state = state
        self.final: set[str] = set()

    def __call__(self, idents: list[str]) -> list[str]:
        from workers.chainstate.sequencer import chain_at_rest  # here: the sequencer imports much

        final = [i for i in idents if _final(self.state, i)]
        self.final = set(final)
        return final if final and chain_at_rest(self.state) else []


def _final(state: StateStore, ident: str) -> bool:
    kind, _, h = ident.partition(":")
    if kind != "block":
        return False
    try:
        e = state.get_block(hex_to_hash(h))
    except ValueError:  # not an id `utxo enqueue` makes: only its task can settle it
        return False
    if e is None or e.status.value not in FINAL:
        return False
    if e.status is BlockStatus.ORPHAN:  # final only while its parent is not in the index: one
        return state.get_block(e.parent) is None  # that is was left so by a worker that died
    return True
