"""The Aerospike server tests may use: `AEROSPIKE_HOSTS` (e.g. 127.0.0.1:3000) names it, and
`AEROSPIKE_NAMESPACE` its namespace (default `test`). Unset: those tests skip, saying so.

Set names are a pool, not one per test: a namespace keeps every set name it has seen (at most
4,095, until the server restarts), so a suite that made one per test would fill it in a few
runs. A test process claims a slot of the pool with a lock file (so two test processes never
share a name) and cycles through its slot's names; `new_url` empties a name before handing it
out, and `drop_set` after the test, so a test only ever sees records it wrote itself.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import time
from collections.abc import Iterator
from typing import IO, Any

import pytest

HOSTS = os.environ.get("AEROSPIKE_HOSTS", "")
NAMESPACE = os.environ.get("AEROSPIKE_NAMESPACE", "test")
SKIP_REASON = (
    "AEROSPIKE_HOSTS is not set: the Aerospike tests need a real server "
    "(e.g. AEROSPIKE_HOSTS=127.0.0.1:3000, namespace AEROSPIKE_NAMESPACE or `test`)"
)
needs_aerospike = pytest.mark.skipif(not HOSTS, reason=SKIP_REASON)
SLOTS, NAMES_PER_SLOT = 32, 24  # at most 768 set names, ever
_slot: tuple[int, IO[str]] | None = None
_names = itertools.count()
_client: Any = None


def aerospike_host() -> tuple[str, int]:
    host, port = HOSTS.split(",")[0].rsplit(":", 1)
    return host, int(port)


def client() -> Any:
    global _client
    if _client is None:
        import aerospike

        _client = aerospike.client({"hosts": [aerospike_host()]}).connect()
    return _client


def _claim_slot() -> int:
    global _slot
    if _slot is None:
        for i in range(SLOTS):
            f = open(
                f"/tmp/utxoflow-aerospike-{NAMESPACE}-slot-{i}.lock", "w"
            )  # held open: the lock lasts the process
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            _slot = (i, f)  # held until this process ends
            break
        else:
            raise RuntimeError(f"all {SLOTS} Aerospike test slots are held by other test processes")
    return _slot[0]


def _empty(name: str) -> None:
    client().truncate(NAMESPACE, name, 0)
    time.sleep(0.002)  # a record written in the truncation's own millisecond would be dropped too


def new_url(**params: str) -> str:
    """The URL of an empty set of the test server, this process's alone until `drop_set`."""
    name = f"u{_claim_slot()}n{next(_names) % NAMES_PER_SLOT}"
    _empty(name)
    query = "&".join(f"{k}={v}" for k, v in {"set": name, **params}.items())
    return f"aerospike://{HOSTS}/{NAMESPACE}?{query}"


def drop_set(_client: object, url: str) -> None:
    """Empty the set `url` names (one this test was handed)."""
    _empty(url.split("set=", 1)[1].split("&", 1)[0])


def fresh_store(batch_size: int, blob_url: str, height: int | None = None) -> Iterator[Any]:
    """A UTXO store (retention 288) on an empty set, at block `height` if given; its set is
    emptied after (a generator: the body of a test's fixture)."""
    from stores.utxo import open_utxo_store

    url = new_url()
    s = open_utxo_store(url, retention=288, batch_size=batch_size, blob_url=blob_url)
    if height is not None:
        s.set_block_height(height)
    yield s
    drop_set(None, url)
    s.close()
