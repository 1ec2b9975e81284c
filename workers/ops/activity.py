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

log = logging.getLogger("utxoflow.activity")
KEY = "utxoflow:activity:"
KINDS = ("blocks", "block_txs", "mempool_txs")
KEEP_S = 300  # fields older than this go (the window shown is a minute)
FLUSH_S = 1.0


class Activity:
    """One process's buffer of counts, flushed to Redis from a daemon thread (started lazily,
    again after a fork: a thread does not survive one)."""

    def __init__(self, broker_url: str) -> None:
        self.url = broker_url
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = defaultdict(int)
        self._pid = -1
        self._client: redis.Redis | None = None
        self._wake = threading.Event()

    def note(self, kind: str, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            self._counts[(kind, int(time.time()))] += n
            if self._pid != os.getpid():
                self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._client = None  # a forked child's connection must be its own
        threading.Thread(target=self._run, name="utxoflow-activity", daemon=True).start()
        atexit.register(self.flush)

    def _run(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            self._wake.wait(FLUSH_S)
            self.flush()

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, defaultdict(int)
        if not counts:
            return
        try:
            if self._client is None:
                self._client = redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)
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
        except (redis.RedisError, OSError) as e:  # rates are shown, never relied on: drop them
            log.debug("activity not recorded: %s", e)


def _stale(kinds: list[str], keys: list[list[bytes]], now: int) -> dict[str, list[bytes]]:
    old: dict[str, list[bytes]] = {}
    for kind, fields in zip(kinds, keys):
        gone = [f for f in fields if int(f) < now - KEEP_S]
        if gone:
            old[kind] = gone
    return old


def rates(r: redis.Redis, window_s: int = 60, now: float | None = None) -> dict[str, float]:
    """Per-second rate of each kind over the last `window_s` seconds (the current second, still
    counting, left out)."""
    end = int(time.time() if now is None else now)
    out: dict[str, float] = {}
    for kind in KINDS:
        fields = r.hgetall(KEY + kind)
        total = sum(int(v) for f, v in fields.items() if end - window_s <= int(f) < end)
        out[kind] = total / window_s
    return out


_activity: Activity | None = None
_off = False  # the broker is not Redis: nothing is recorded


def note(kind: str, n: int = 1) -> None:
    """Count `n` of `kind` for this process (the broker from the settings)."""
    global _activity, _off
    if _activity is None:
        if _off:
            return
        from workers.broker import is_redis
        from workers.settings import load_settings

        url = load_settings().broker_url
        if not is_redis(url):
            _off = True
            return
        _activity = Activity(url)
    _activity.note(kind, n)


def flush() -> None:
    """Hand on what this process counted (a pool child about to end)."""
    if _activity is not None:
        _activity.flush()
