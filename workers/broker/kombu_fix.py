"""Workarounds for kombu and Celery bugs that kill or stall a worker (seen with kombu 5.7.0,
Celery 5.7.0).

1. A message a worker cannot take. Not JSON, or JSON that is not a kombu message (`null`, `42`,
   a list, an object without properties, a body its encoding cannot decode), or a kombu message
   that is not a task message Celery can run without dying: a task header without an `id`
   (Celery takes its KeyError for a lost connection and reconnects for ever), a body that is not
   [args, kwargs, embed] (its ValueError stops the worker, and the message, back on the queue,
   stops the next), or one larger than MAX_MESSAGE_BYTES (this project's messages carry ids,
   never blocks: a few hundred bytes). The Redis transport decodes a message it has just popped,
   and builds kombu's `Message` from it, inside the worker's event loop (`Channel._brpop_read`,
   `Transport._deliver`); here each such message is checked there, and one that fails is set
   aside instead: a record of it (why, its size, its SHA-256, its first bytes and its headers,
   bounded) pushed on the dead-letter list DEAD_LETTERS (the newest DEAD_LETTERS_KEEP), the
   counter DEAD_LETTERS_TOTAL incremented (`utxo status`, `utxo metrics`, `utxo dead-letters`
   lists and drops them), an error logged; never delivered, the consumer going on. What a
   well-formed task message says is Celery's to judge (it rejects one it cannot read, and lives
   on: tests/pipeline/test_faults.py).

2. The broker going away mid-read (tests/pipeline/test_redis_restart.py and test_kombu_fix.py).

When the connection is lost while the worker's channel is inside a BRPOP, Celery first
`collect()`s the connection: closing the channel fails there (the read raises a connection
error, which is ignored, and leaves the channel open), and the transport is then detached
(`transport.client = None`). Celery then closes the connection again; the channel's second
close restores its unacknowledged messages, which asks the detached transport for its host:
AttributeError — not a connection error, so nothing ignores it, and the worker's main process
exits ("Unrecoverable error") instead of reconnecting.

The patches replace private attributes of kombu: kombu is pinned to the version they were written
for (pyproject.toml), and `apply` checks the version and the attributes first.

Invariants: nothing changes while the transport is attached. Detached, the channel's
connection parameters raise redis's ConnectionError, one of the transport's connection errors,
which every caller on the close path already ignores; the messages that could not be restored
are lost with the broker anyway, and workers/recovery/requeue.py sends them again. Applying twice is
harmless.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

ORIGINAL = kombu_redis.Channel._connparams  # kombu's own (tests/pipeline/test_kombu_fix.py)
ORIGINAL_BRPOP_READ = kombu_redis.Channel._brpop_read
ORIGINAL_LOADS = kombu_redis.loads
ORIGINAL_DELIVER = kombu_redis.Transport._deliver
DEAD_LETTERS = "utxoflow:dead-letters"  # the newest records of messages set aside (JSON)
DEAD_LETTERS_TOTAL = "utxoflow:dead-letters:total"  # how many were, ever
DEAD_LETTERS_KEEP = 1000
MAX_MESSAGE_BYTES = 1 << 20  # a message larger than this is set aside unread
HEAD_BYTES = 200  # a record keeps this much of the message (and of its headers)
log = logging.getLogger("utxoflow.broker")


class Undecodable(ValueError):
    """A message that is not JSON, or too large to read (a ValueError, as the decode error it
    replaces: every other caller of the transport's `loads` handles it as before)."""

    def __init__(self, raw: Any, why: str) -> None:
        super().__init__(why)
        self.raw = raw


def _loads(s: Any) -> Any:
    if isinstance(s, (str, bytes)) and len(s) > MAX_MESSAGE_BYTES:
        raise Undecodable(s, f"a message of {len(s):,} bytes (at most {MAX_MESSAGE_BYTES:,})")
    try:
        return ORIGINAL_LOADS(s)
    except (ValueError, TypeError) as e:
        raise Undecodable(s, f"a message that is not JSON: {e}") from e


def dead_letter(raw: str | bytes, why: str, headers: Any = None) -> dict[str, Any]:
    """The record kept of a message set aside: bounded whatever the message's size."""
    data = raw.encode() if isinstance(raw, str) else raw
    shown = json.dumps(headers, default=repr)[:HEAD_BYTES] if headers is not None else None
    return {"at": round(time.time(), 3), "reason": why[:HEAD_BYTES * 2], "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "head": data[:HEAD_BYTES].decode("utf-8", "replace"),
            "headers": shown}


def _reject(channel: Any, raw: str | bytes, why: str, headers: Any = None) -> None:
    """Set aside a message already popped: log it, keep its record, and go on consuming."""
    record = dead_letter(raw, why, headers)
    log.error("set aside %s (%d bytes, sha256 %s, listed by `utxo dead-letters`): %r…",
              why, record["bytes"], record["sha256"][:16], record["head"][:80])
    try:
        with channel.conn_or_acquire() as client:
            keep = client.pipeline().lpush(DEAD_LETTERS, json.dumps(record))
            keep.ltrim(DEAD_LETTERS, 0, DEAD_LETTERS_KEEP - 1).incr(DEAD_LETTERS_TOTAL).execute()
    except Exception as err:  # keeping a record is a courtesy; consuming on is what matters
        log.warning("could not keep the record of the message set aside: %s", err)


def _brpop_read(self: Any, **options: Any) -> Any:
    try:
        return ORIGINAL_BRPOP_READ(self, **options)
    except Undecodable as e:
        _reject(self, e.raw if isinstance(e.raw, (str, bytes)) else repr(e.raw), str(e))
        return False


_ROUTE = ("exchange", "routing_key")  # what a redelivery of an unacknowledged message reads


def _shape_problem(channel: Any, payload: Any) -> str | None:
    """Why kombu could not deliver, acknowledge or redeliver `payload`, or Celery run it
    without dying (None: they can)."""
    try:
        message = channel.Message(payload, channel=channel)
        info = message.delivery_info
        if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in _ROUTE):
            return "no delivery info (exchange and routing key)"
        headers = message.headers
        if isinstance(headers, dict) and "task" in headers:  # a task message (protocol 2)
            if not isinstance(headers.get("id"), str) or not headers["id"]:
                return "a task message without an id"
            body = json.loads(message.body)
            if not (isinstance(body, list) and len(body) == 3 and isinstance(body[0], list)
                    and isinstance(body[1], dict) and isinstance(body[2], dict)):
                return "a task message whose body is not [args, kwargs, embed]"
    except Exception as e:  # whatever kombu's reading of it raises
        return f"{type(e).__name__}: {e}"
    return None


def _deliver(self: Any, message: Any, queue: Any) -> Any:
    channel = next((c for c in self.channels if c), None)
    if channel is not None and (why := _shape_problem(channel, message)) is not None:
        headers = message.get("headers") if isinstance(message, dict) else None
        why = f"a message that is not a task message a worker can take ({why})"
        _reject(channel, json.dumps(message), why, headers)
        return None
    return ORIGINAL_DELIVER(self, message, queue)


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if self.connection is None or self.connection.client is None:
        raise redis.ConnectionError("the broker connection was already released")
    return ORIGINAL(self, asynchronous=asynchronous)


TESTED = "5.7."  # the kombu these patches were written and tested for (pyproject pins it)
PATCHED = (("Channel", "_connparams"), ("Channel", "_brpop_read"), ("Transport", "_deliver"))


def kombu_problem(version: str) -> str | None:
    """Why the patches below cannot be trusted on this kombu (another version, or a private
    attribute they replace gone), or None."""
    if not version.startswith(TESTED):
        return (f"workers/broker/kombu_fix.py patches kombu {TESTED}x's Redis transport, and this is kombu "
                f"{version}: install the version pyproject.toml pins")
    missing = [f"{c}.{a}" for c, a in PATCHED if not hasattr(getattr(kombu_redis, c), a)]
    if missing or not hasattr(kombu_redis, "loads"):
        lacks = ", ".join(missing) or "loads"
        return f"kombu {version}'s Redis transport lacks {lacks}: workers/broker/kombu_fix.py cannot patch it"
    return None


def apply() -> None:
    """Patch kombu (see the module); RuntimeError naming the problem on a kombu they were not
    written for: a worker refuses to start rather than run with bugs the patches hide."""
    import kombu

    problem = kombu_problem(kombu.__version__)
    if problem is not None:
        raise RuntimeError(problem)
    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]
    kombu_redis.loads = _loads  # type: ignore[assignment]
    kombu_redis.Channel._brpop_read = _brpop_read  # type: ignore[method-assign]
    kombu_redis.Transport._deliver = _deliver  # type: ignore[method-assign]
