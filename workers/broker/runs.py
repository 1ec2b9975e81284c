"""The broker's identity: which run of the Redis server a message was sent to.

Redis's `INFO server` `run_id` is a random id chosen at every start of the server. The broker
here keeps nothing on disk, so a run_id other than the one a pending message was sent under
means the message is certainly gone (with its queue); the same run_id means it may merely be
slow. A Redis that does persist its queues also changes run_id on a restart: its messages are
then re-sent needlessly, which is harmless (every task is idempotent).

Invariants:
- A cached run_id is at most `max_age_s` old, and can only be stale towards an earlier run: a
  message recorded under it looks lost and is re-sent once (harmless). A lost message never
  looks safe: the run_id is read before the send it is recorded for, so it names the run the
  message went to or an earlier one, never a later one.
- Brokers other than Redis have no run: `current()` is None for them, and only age counts.
"""

from __future__ import annotations

import threading
import time

import redis

from workers.broker.redisurl import SCHEMES, connect, is_sentinel, sentinel_target


def is_redis(url: str) -> bool:
    """Whether a broker URL names a Redis, directly or through its sentinels (the only broker
    with runs and an `unacked` hash)."""
    return url.split("://", 1)[0].lower() in SCHEMES


def url_problem(url: str) -> str | None:
    """Why a broker URL cannot work, found without connecting (None: it may work): empty, not
    `scheme://…`, a scheme that is no transport of kombu's, a port or (Redis) database that is
    no number. Celery and kombu would say so only at the first send, deep in a traceback (an
    unknown scheme is a KeyError). The answer never repeats the URL (it may hold a password):
    the caller names it, masked."""
    from urllib.parse import urlsplit

    from kombu.transport import TRANSPORT_ALIASES

    if not url.strip():
        return "it is empty (e.g. redis://127.0.0.1:6379/0)"
    urls = [u.strip() for u in url.split(";")]  # kombu's fail-over: URLs separated by ";"
    for k, one in enumerate(urls):
        which = f"URL {k + 1} of {len(urls)}: " if len(urls) > 1 else ""
        scheme, sep, _rest = one.partition("://")
        if not sep or not scheme:
            return f"{which}not a URL: scheme://HOST:PORT/… (e.g. redis://127.0.0.1:6379/0)"
        # kombu takes `transport+url` as the transport (redis+socket://), else the scheme as
        # urllib reads it (lower-case)
        transport = scheme.split("+", 1)[0] if "+" in scheme else scheme.lower()
        if transport not in TRANSPORT_ALIASES:
            known = ", ".join(sorted({t.lower() for t in TRANSPORT_ALIASES}))
            return f"{which}unknown scheme {scheme!r} (kombu's transports: {known})"
        try:
            parts = urlsplit(one)
            parts.port  # noqa: B018  (raises ValueError for a port that is none)
        except ValueError as e:
            return f"{which}{str(e)[:1].lower()}{str(e)[1:]}"
        db = parts.path.strip("/")
        if is_redis(scheme) and db and not db.isdigit():
            return f"{which}the database (after the host) must be a number, got {db!r}"
    if is_sentinel(urls[0]):
        try:
            target = sentinel_target(url)
        except ValueError as e:
            return str(e)
        if target.master_name is None:
            return "a Sentinel broker needs the primary's name: sentinel://HOST:PORT/0?master_name=NAME;…"
    return None


def server_problem(url: str) -> str | None:
    """Why a Redis broker that answers cannot work with this URL: it refuses the database (an
    index past its `databases`) or the credentials. Asked once, with a short timeout; a broker
    that does not answer is no problem here (it may be starting: the consumer waits for it)."""
    if not is_redis(url) or (";" in url and not is_sentinel(url)):
        return None
    if is_sentinel(url):
        unknown = _unknown_master(url)
        if unknown is not None:
            return unknown
    try:
        client = connect(url, timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.AuthenticationError, redis.ResponseError) as e:
        return f"the Redis there refuses it: {e}"
    except (redis.RedisError, OSError):
        return None
    return None


def _unknown_master(url: str) -> str | None:
    """Sentinels that answer and none of which monitors the URL's primary (None: one does, or
    none answers: they may be starting)."""
    t = sentinel_target(url)
    answered = False
    for host, port in t.sentinels:
        s = redis.Redis(host=host, port=port, socket_timeout=2, socket_connect_timeout=2)
        try:
            if s.sentinel_get_master_addr_by_name(t.master_name):
                return None
            answered = True
        except redis.ResponseError:  # it answers, and no SENTINEL command: a plain Redis
            return f"{host}:{port} is no Redis Sentinel (it answers as a Redis: use redis://)"
        except (redis.RedisError, OSError):
            continue
        finally:
            s.close()
    if not answered:
        return None
    return f"the sentinels there monitor no primary named {t.master_name!r}"


def broker_error(url: str) -> str | None:
    """The one line that refuses a broker URL that cannot work — one no broker takes
    (`url_problem`), or one a Redis that answers refuses (`server_problem`) — naming the setting
    and the URL with its password masked; None when it may work. What every command that uses
    the broker checks before it starts."""
    from stores.sqldb import mask_url

    problem = url_problem(url) or server_problem(url)
    return None if problem is None else f"UTXO_BROKER_URL ({mask_url(url)}): {problem}"


class BrokerUnreachable(Exception):
    """The broker did not answer: nothing can be sent now."""


class BrokerRun:
    def __init__(self, url: str, max_age_s: float = 1.0) -> None:
        self.url = url
        self.max_age_s = max_age_s
        self._is_redis = is_redis(url)
        self._client: redis.Redis | None = None
        self._cached: tuple[float, str] | None = None
        self._lock = threading.Lock()

    def current(self, fresh: bool = False) -> str | None:
        """The broker's run_id (None: a broker without one). Raises BrokerUnreachable."""
        if not self._is_redis:
            return None
        with self._lock:
            now = time.monotonic()
            if not fresh and self._cached is not None and now - self._cached[0] < self.max_age_s:
                return self._cached[1]
            try:
                if self._client is None:
                    self._client = connect(self.url, timeout=5)
                run = str(self._client.info("server")["run_id"])
            except (redis.RedisError, OSError, KeyError) as e:
                raise BrokerUnreachable(f"the broker did not answer: {e}") from e
            self._cached = (now, run)
            return run

    def known(self) -> str:
        """The run_id to record with a message being sent: "" when it cannot be told (the
        message is then taken for lost at the next scan, and re-sent)."""
        try:
            return self.current() or ""
        except BrokerUnreachable:
            return ""
