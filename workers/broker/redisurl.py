"""Redis broker URLs, and the one place a Redis client is made from one: `redis://`,
`rediss://`, and Redis Sentinel (`sentinel://`), so that losing the primary loses no worker.

A Sentinel URL lists the sentinels, `;`-separated as kombu takes them, with the database on the
first and the name of the monitored primary in a `master_name` query (kombu wants it as a
transport option; one string in UTXO_BROKER_URL keeps every command's broker in one setting):

    sentinel://:PASSWORD@10.0.0.1:26379/0?master_name=utxoflow;sentinel://10.0.0.2:26379;…

Invariants:
- Every Redis client of the broker comes from `connect`: on Sentinel it is the current primary's,
  asked of the sentinels again after a connection fails (redis-py's master_for), so a client
  made before a failover follows it.
- Celery and kombu get the URL without the query and the name as `master_name`
  (`for_kombu`); the password, on the first URL, is the primary's (sentinels without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.sentinel import Sentinel

SCHEMES = ("redis", "rediss", "sentinel")


def scheme_of(url: str) -> str:
    return url.strip().split("://", 1)[0].lower()


def is_sentinel(url: str) -> bool:
    return scheme_of(url) == "sentinel"


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    sentinels: list[tuple[str, int]]
    master_name: str | None
    db: int
    username: str | None
    password: str | None


def sentinel_target(url: str) -> SentinelTarget:
    """What a Sentinel URL names (ValueError: a part that is not `sentinel://HOST:PORT`)."""
    parts = [urlsplit(p.strip()) for p in url.split(";") if p.strip()]
    sentinels: list[tuple[str, int]] = []
    master: str | None = None
    for p in parts:
        if p.scheme.lower() != "sentinel" or not p.hostname:
            raise ValueError("every URL of a Sentinel broker must be sentinel://HOST:PORT")
        sentinels.append((p.hostname, p.port or 26379))
        named = parse_qs(p.query).get("master_name")
        master = master or (named[0] if named else None)
    first = parts[0]
    db = first.path.strip("/")
    return SentinelTarget(
        sentinels, master, int(db) if db.isdigit() else 0,
        unquote(first.username) if first.username else None,
        unquote(first.password) if first.password else None,
    )


def for_kombu(url: str) -> tuple[str, dict[str, str]]:
    """The URL Celery and kombu are given, and the transport options it needs besides (a URL
    that does not parse is given as it is: the commands refuse it before they use it,
    workers.broker.runs.broker_error)."""
    if not is_sentinel(url):
        return url, {}
    bare = ";".join(p.strip().split("?", 1)[0] for p in url.split(";") if p.strip())
    try:
        name = sentinel_target(url).master_name
    except ValueError:
        return url, {}
    return bare, ({"master_name": name} if name else {})


def connect(url: str, timeout: float = 5.0) -> redis.Redis:
    """A client of the broker's Redis (its primary, on Sentinel)."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url.strip(), socket_timeout=timeout, socket_connect_timeout=timeout)
    t = sentinel_target(url)
    if t.master_name is None:
        raise ValueError("a Sentinel broker URL needs ?master_name=NAME")
    timeouts = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    sentinel = Sentinel(t.sentinels, sentinel_kwargs=dict(timeouts), **timeouts)
    return sentinel.master_for(t.master_name, db=t.db, username=t.username, password=t.password, **timeouts)
