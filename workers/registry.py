"""What has been enqueued and not yet processed, for `utxo wait`: a Redis set of message ids.

Invariants: an id is added before its message is sent and removed only when its task has
finished for good (done, refused, or given up after its retries), so "the set holds none of
the ids present when I started waiting" means everything enqueued by then has been processed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

KEY = "utxoflow:pending"


class Registry:
    def __init__(self, url: str) -> None:
        self.redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)

    def add(self, ident: str) -> None:
        self.redis.sadd(KEY, ident)

    def done(self, ident: str) -> None:
        self.redis.srem(KEY, ident)

    def pending(self) -> set[str]:
        return {m.decode() for m in self.redis.smembers(KEY)}  # type: ignore[union-attr]

    def wait(
        self, timeout: float, poll: float = 0.2, settled: Callable[[str], bool] | None = None
    ) -> bool:
        """True once none of the ids pending now is pending any more; False on timeout. An id
        that `settled` says is done anyway (a block another worker applied while the message's
        own worker died) is taken off the set."""
        waiting = sorted(self.pending())
        deadline = time.monotonic() + timeout
        while waiting:
            left = self.redis.smismember(KEY, waiting)  # type: ignore[arg-type]
            waiting = [w for w, still in zip(waiting, left) if still]
            if settled is not None:
                for w in [w for w in waiting if settled(w)]:
                    self.done(w)
                    waiting.remove(w)
            if not waiting:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True
