"""Workarounds for two kombu bugs that kill a worker (seen with kombu 5.7.0, Celery 5.7.0).

1. A message that is not JSON, or JSON that is not a kombu message (`null`, `42`, a list, an
   object without properties, a body its encoding cannot decode: tests/pipeline/test_faults.py).
   The Redis transport decodes a message it has just popped, and builds kombu's `Message` from
   it, inside the worker's event loop (`Channel._brpop_read`, `Transport._deliver`); the error
   escapes the loop and the worker's main process exits. Here such a message is dropped with an
   error in the log and its bytes kept (the newest `UNDECODABLE_KEEP`) in the Redis list
   `UNDECODABLE_KEY` for inspection: rejected, never delivered, the queue not blocked. The
   shape is checked by building the `Message` as the channel will (kombu's own reading of it),
   plus the delivery info a redelivery reads; what the body says is Celery's to judge (it
   rejects a task message it cannot read, and lives on).

2. The broker going away mid-read (tests/pipeline/test_redis_restart.py and test_kombu_fix.py).

When the connection is lost while the worker's channel is inside a BRPOP, Celery first
`collect()`s the connection: closing the channel fails there (the read raises a connection
error, which is ignored, and leaves the channel open), and the transport is then detached
(`transport.client = None`). Celery then closes the connection again; the channel's second
close restores its unacknowledged messages, which asks the detached transport for its host:
AttributeError — not a connection error, so nothing ignores it, and the worker's main process
exits ("Unrecoverable error") instead of reconnecting.

Invariants: nothing changes while the transport is attached. Detached, the channel's
connection parameters raise redis's ConnectionError, one of the transport's connection errors,
which every caller on the close path already ignores; the messages that could not be restored
are lost with the broker anyway, and workers/requeue.py sends them again. Applying twice is
harmless.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

ORIGINAL = kombu_redis.Channel._connparams  # kombu's own (tests/pipeline/test_kombu_fix.py)
ORIGINAL_BRPOP_READ = kombu_redis.Channel._brpop_read
ORIGINAL_LOADS = kombu_redis.loads
ORIGINAL_DELIVER = kombu_redis.Transport._deliver
UNDECODABLE_KEY = "utxoflow:undecodable"
UNDECODABLE_KEEP = 100
log = logging.getLogger("utxoflow.broker")


class Undecodable(ValueError):
    """A message that is not JSON (a ValueError, as the decode error it replaces: every other
    caller of the transport's `loads` handles it as before)."""

    def __init__(self, raw: Any, cause: Exception) -> None:
        super().__init__(f"a message that is not JSON: {cause}")
        self.raw = raw


def _loads(s: Any) -> Any:
    try:
        return ORIGINAL_LOADS(s)
    except (ValueError, TypeError) as e:
        raise Undecodable(s, e) from e


def _reject(channel: Any, raw: str | bytes, why: str) -> None:
    """Drop a message already popped: log it, keep its bytes, and go on consuming."""
    log.error("rejected %s (%d bytes, kept in the Redis list %s): %r…",
              why, len(raw), UNDECODABLE_KEY, raw[:80])
    try:
        with channel.conn_or_acquire() as client:
            keep = client.pipeline().lpush(UNDECODABLE_KEY, raw)
            keep.ltrim(UNDECODABLE_KEY, 0, UNDECODABLE_KEEP - 1).execute()
    except Exception as err:  # keeping a copy is a courtesy; consuming on is what matters
        log.warning("could not keep the rejected message: %s", err)


def _brpop_read(self: Any, **options: Any) -> Any:
    try:
        return ORIGINAL_BRPOP_READ(self, **options)
    except Undecodable as e:
        _reject(self, e.raw if isinstance(e.raw, (str, bytes)) else repr(e.raw), str(e))
        return False


_ROUTE = ("exchange", "routing_key")  # what a redelivery of an unacknowledged message reads


def _shape_problem(channel: Any, payload: Any) -> str | None:
    """Why kombu could not deliver, acknowledge or redeliver `payload` (None: it can)."""
    try:
        message = channel.Message(payload, channel=channel)
        info = message.delivery_info
        if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in _ROUTE):
            return "no delivery info (exchange and routing key)"
    except Exception as e:  # whatever kombu's reading of it raises
        return f"{type(e).__name__}: {e}"
    return None


def _deliver(self: Any, message: Any, queue: Any) -> Any:
    channel = next((c for c in self.channels if c), None)
    if channel is not None and (why := _shape_problem(channel, message)) is not None:
        _reject(channel, json.dumps(message), f"a message that is not a kombu message ({why})")
        return None
    return ORIGINAL_DELIVER(self, message, queue)


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if self.connection is None or self.connection.client is None:
        raise redis.ConnectionError("the broker connection was already released")
    return ORIGINAL(self, asynchronous=asynchronous)


def apply() -> None:
    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]
    kombu_redis.loads = _loads  # type: ignore[assignment]
    kombu_redis.Channel._brpop_read = _brpop_read  # type: ignore[method-assign]
    kombu_redis.Transport._deliver = _deliver  # type: ignore[method-assign]
