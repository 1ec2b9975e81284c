"""Which workers are alive, and giving back the messages a dead one held.

Kombu's Redis transport keeps each message a worker has taken but not acknowledged in the hash
`unacked` (delivery tag → message) until the ack; a worker that dies leaves them there, and
Redis hands them back only after the visibility timeout (an hour, longer than any task). Here:
- every worker's main process writes `utxoflow:alive:<node>` with an expiry of one
  UTXO_RECOVERY_LEASE, renewed every third of it (`Heartbeat`), and notes each message it
  receives in the hash `utxoflow:taken` (delivery tag → node);
- the recovery manager's leader (`restore_dead`) puts back on its queue, at the front, every
  unacknowledged message noted by a node whose key has expired, and forgets the notes of
  messages no longer unacked. A message nobody noted (its worker died between taking it and
  noting it, or the note failed) is left to the re-sending scan (UTXO_REQUEUE_AFTER) and to
  Redis's own visibility timeout: guessing would hand a live worker's message to another —
  but for a block message: the manager re-sends a pending one that neither a queue nor a
  noted delivery holds, twice seen so (`held_block_messages`, `RecoveryManager._lost_blocks`):
  the chain must not wait UTXO_REQUEUE_AFTER for it, and a second delivery costs nothing.

Invariants: a message is restored by kombu's own `restore_by_tag` (one Redis transaction that
moves it from `unacked` to its queue), so it is never both restored and left, nor restored
twice; restoring a message whose worker was in fact alive (a pause longer than the lease) costs
a duplicate delivery, which every task tolerates (they are idempotent).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from workers.broker.redisurl import connect

log = logging.getLogger("utxoflow.recovery")
ALIVE = "utxoflow:alive:"
TAKEN = "utxoflow:taken"
UNACKED = "unacked"  # kombu's Redis transport's own hash of unacknowledged messages


def client(url: str) -> redis.Redis:
    return connect(url, timeout=5)


class Heartbeat:
    """A worker's liveness key, renewed from a thread of its main process."""

    def __init__(self, url: str, node: str, lease_s: float) -> None:
        self.r, self.node, self.lease_s = client(url), node, lease_s
        self._last = 0.0
        self._lock = threading.Lock()

    def beat(self) -> None:
        with self._lock:
            value = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()})
            try:
                self.r.set(ALIVE + self.node, value, px=max(1, int(self.lease_s * 1000)))
                self._last = time.monotonic()
            except redis.RedisError as e:  # the broker is away: the worker is too, for it
                log.warning("could not renew this worker's liveness: %s", e)

    def taken(self, tag: str) -> None:
        """Note a message this worker received (renewing its key first when due, so a message
        is never noted under a key that has lapsed)."""
        if time.monotonic() - self._last > self.lease_s / 3:
            self.beat()
        try:
            self.r.hset(TAKEN, tag, self.node)
        except redis.RedisError as e:
            log.warning("could not note message %s as taken: %s", tag, e)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.beat()
            stop.wait(self.lease_s / 3)


def restore_dead(r: redis.Redis, restore: Callable[[str], None]) -> dict[str, Any]:
    """Put back the messages dead workers held (see the module); what was done."""
    # the notes first: one written after this read is never taken for stale below
    noted_before = {_text(t) for t in r.hkeys(TAKEN)}
    tags = [_text(t) for t in r.hkeys(UNACKED)]
    restored: list[str] = []
    if tags:
        alive: dict[str, bool] = {}
        for tag, noted in zip(tags, r.hmget(TAKEN, tags), strict=True):
            if noted is None:
                continue  # not noted (yet): see the module
            node = _text(noted)
            if node not in alive:
                alive[node] = bool(r.exists(ALIVE + node))
            if not alive[node]:
                restore(tag)
                restored.append(tag)
    stale = (noted_before - set(tags)) | set(restored)
    if stale:
        r.hdel(TAKEN, *stale)
    if restored:
        log.warning("gave back %d message(s) that dead workers held", len(restored))
    return {"unacked": len(tags), "restored": len(restored)}


def queue_keys(queue: str) -> tuple[str, ...]:
    """The Redis lists kombu keeps a queue's messages in, one per priority step."""
    from kombu.transport.redis import PRIORITY_STEPS, Channel

    return (queue, *(f"{queue}{Channel.sep}{p}" for p in PRIORITY_STEPS if p))


def held_block_messages(r: redis.Redis, queue: str = "blocks") -> set[str]:
    """The message ids (a block task's second argument) of the messages waiting on `queue`
    (every priority) and of the unacknowledged ones a worker noted as taken."""
    pipe = r.pipeline(transaction=False)
    for key in queue_keys(queue):
        pipe.lrange(key, 0, -1)
    waiting = [raw for found in pipe.execute() for raw in found]
    noted = {_text(t) for t in r.hkeys(TAKEN)}
    held = [raw for tag, raw in r.hgetall(UNACKED).items() if _text(tag) in noted]
    out = {i for raw in waiting if (i := message_ident(raw)) is not None}
    for raw in held:
        try:
            envelope = json.loads(raw)[0]  # (kombu keeps [message, exchange, routing key])
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        if (i := _ident(envelope)) is not None:
            out.add(i)
    return out


def message_ident(raw: bytes | str) -> str | None:
    """The id (the second argument) of a task message as kombu keeps it in Redis (a JSON
    envelope with a base64 JSON body), or None for anything else."""
    try:
        return _ident(json.loads(raw))
    except ValueError:
        return None


def _ident(envelope: Any) -> str | None:
    try:
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[1]) if isinstance(args, list) and len(args) > 1 else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def kombu_restore(app: Any) -> Callable[[str], None]:
    """A restore by delivery tag through kombu's own Redis transport, to the front of its queue
    (kombu publishes with LPUSH and consumes from the right: `leftmost=False` is the front)."""

    def restore(tag: str) -> None:
        with app.connection_for_write() as conn:
            conn.default_channel.qos.restore_by_tag(tag, leftmost=False)

    return restore
