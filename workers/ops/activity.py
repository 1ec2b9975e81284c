"""Recent activity, per second, in the broker's Redis: what `utxo status` turns into rates over
the last minute without a Prometheus server.

Each process counts what it did (blocks applied, their transactions, mempool transactions) in
memory and adds it, at most once a second and at exit, to one Redis hash per kind
(`utxoflow:activity:<kind>`, field: the Unix second, value: the count). A reader sums the fields
of the window. Invariants: counts are only ever added (HINCRBY), so any number of processes on
any number of hosts can write at once; a field older than `KEEP_S` is removed by whoever writes
next, so a hash holds a few hundred fields at most; losing the hash (a Redis restart) loses
only the rates shown, never anything of the chain. A broker that is not Redis records nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import defaultdict

import redis

from workers.broker.redisurl import connect

log = logging.getLogger("utxoflow.activity")
KEY = "utxoflow:activity:"
KINDS = ("blocks", "block_txs", "mempool_txs")
KEEP_S = 300  # fields older than this go (the window shown is a minute)
FLUSH_S = 1.0


class Activity:
    """One process's buffer of counts, flushed to Redis from a daemon thread started at the
    first count. After a fork the child gets a fresh one (`_after_fork`): the parent's lock may
    be held by its flushing thread at that instant, and its counts are its own to flush."""

    def __init__(self, broker_url: str) -> None:
        self.url = broker_url
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = defaultdict(int)
        self._client: redis.Redis | None = None
        self._started = False

    def note(self, kind: str, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            self._counts[(kind, int(time.time()))] += n
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="utxoflow-activity", daemon=True).start()

    def _run(self) -> None:
        while _activity is self:  # (a fork's child has its own; this thread is not in it anyway)
            time.sleep(FLUSH_S)
            self.flush()

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, defaultdict(int)
        if not counts:
            return
        try:
            if self._client is None:
                self._client = connect(self.url, timeout=2)
            now = int(time.time())
            pipe = self._client.pipeline(transaction=False)
            for (kind, second), n in counts.items():
                pipe.hincrby(KEY + kind, str(second), n)
            kinds = sorted({k for k, _s in counts})
            for kind in kinds:
                pipe.hkeys(KEY + kind)
            replies = pipe.execute()
            old = _stale(kinds, replies[len(counts):], now)
            if old:
                pipe = self._client.pipeline(transaction=False)
                for kind, fields in old.items():
                    pipe.hdel(KEY + kind, *fields)
                pipe.execute()
        except Exception as e:  # rates are shown, never relied on: they are dropped, never raised
            log.debug("activity not recorded: %s", e)


def _second(field: bytes | str) -> int | None:
    try:
        return int(field)
    except ValueError:  # (not one of ours: left alone)
        return None


def _stale(kinds: list[str], keys: list[list[bytes]], now: int) -> dict[str, list[bytes]]:
    old: dict[str, list[bytes]] = {}
    for kind, fields in zip(kinds, keys):
        gone = [f for f in fields if (s := _second(f)) is not None and s < now - KEEP_S]
        if gone:
            old[kind] = gone
    return old


def rates(r: redis.Redis, window_s: int = 60, now: float | None = None) -> dict[str, float]:
    """Per-second rate of each kind over the last `window_s` seconds (the current second, still
    counting, left out)."""
    end = int(time.time() if now is None else now)
    out: dict[str, float] = {}
    for kind in KINDS:
        total = 0
        for f, v in r.hgetall(KEY + kind).items():
            s = _second(f)
            if s is not None and end - window_s <= s < end:
                total += int(v)
        out[kind] = total / window_s
    return out


# This process's recorder: none until a worker enables it (`enable`, at worker start), so that
# library use of the sequencer, tests and the CLI write nothing anywhere.
_url: str | None = None
_activity: Activity | None = None


def enable(broker_url: str) -> None:
    """Record this process's activity (and its forked children's) in the broker at `broker_url`
    (a broker that is not Redis: nothing is recorded)."""
    global _url, _activity
    from workers.broker.runs import is_redis

    if is_redis(broker_url):
        _url, _activity = broker_url, Activity(broker_url)


def _after_fork() -> None:
    global _activity
    _activity = Activity(_url) if _url is not None else None


os.register_at_fork(after_in_child=_after_fork)


def note(kind: str, n: int = 1) -> None:
    """Count `n` of `kind` for this process; never raises (see `Activity.flush`)."""
    a = _activity
    if a is not None:
        try:
            a.note(kind, n)
        except Exception as e:
            log.debug("activity not noted: %s", e)


def flush() -> None:
    """Hand on what this process counted (a pool child about to end, or at exit)."""
    if _activity is not None:
        _activity.flush()


atexit.register(flush)
