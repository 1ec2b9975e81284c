"""workers/broker/kombu_fix.py: closing a Redis channel that holds an unacknowledged message after its
transport was detached (what Celery does when the broker connection is lost mid-BRPOP) raises a
connection error, which the close path ignores, instead of the AttributeError that made the
worker exit."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from kombu import Connection
from kombu.transport import redis as kombu_redis

from tests.pipeline.redis_server import RedisServer, broker_fixture  # noqa: F401  (the fixture)
from workers.broker import kombu_fix


def detached_channel_holding_a_message(url: str) -> tuple[Connection, Any]:
    """A channel with one message delivered and not acknowledged, whose connection's transport
    has been detached as `Connection.collect()` detaches it."""
    conn = Connection(url)
    ch = conn.default_channel
    ch.queue_declare(queue="q")
    ch.basic_publish(ch.prepare_message("m"), exchange="", routing_key="q")
    assert ch.basic_get("q", no_ack=False) is not None
    assert ch.qos._delivered  # what the close restores
    conn.transport.client = None
    return conn, ch


def test_closing_a_detached_channel_is_a_connection_error(broker: RedisServer) -> None:
    kombu_fix.apply()
    _conn, ch = detached_channel_holding_a_message(broker.url)
    with pytest.raises(redis.ConnectionError):
        ch.close()
    conn2, ch2 = detached_channel_holding_a_message(broker.url)
    conn2.maybe_close_channel(ch2)  # ignored, as on Celery's close path
    assert ch2.closed


def test_kombu_unpatched_still_has_the_bug(broker: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """When this fails, kombu has fixed the bug: workers/broker/kombu_fix.py can go."""
    monkeypatch.setattr(kombu_redis.Channel, "_connparams", kombu_fix.ORIGINAL)
    conn, ch = detached_channel_holding_a_message(broker.url)
    with pytest.raises(AttributeError, match="hostname"):
        conn.maybe_close_channel(ch)


def test_the_patches_refuse_a_kombu_they_were_not_written_for() -> None:
    """kombu is pinned (pyproject.toml) and checked before the patches go on: another version is
    refused with a line that says which and what to do (issue 37)."""
    import kombu

    from workers.broker.kombu_fix import kombu_problem

    assert kombu_problem(kombu.__version__) is None
    said = kombu_problem("5.8.0")
    assert said is not None and "kombu 5.8.0" in said and "pins" in said
