"""The Aerospike server tests may use: `AEROSPIKE_HOSTS` (e.g. 127.0.0.1:3000) names it, and
`AEROSPIKE_NAMESPACE` its namespace (default `test`). Unset: those tests skip, saying so.

Each user of it gets a set of its own (`new_url`), and `drop_set` truncates only that set, so a
test never touches records it did not write.
"""

from __future__ import annotations

import os
import uuid

import pytest

HOSTS = os.environ.get("AEROSPIKE_HOSTS", "")
NAMESPACE = os.environ.get("AEROSPIKE_NAMESPACE", "test")
SKIP_REASON = (
    "AEROSPIKE_HOSTS is not set: the Aerospike tests need a real server "
    "(e.g. AEROSPIKE_HOSTS=127.0.0.1:3000, namespace AEROSPIKE_NAMESPACE or `test`)"
)
needs_aerospike = pytest.mark.skipif(not HOSTS, reason=SKIP_REASON)


def new_url(**params: str) -> str:
    """The URL of a fresh set on the test server."""
    query = "&".join(f"{k}={v}" for k, v in {"set": f"t{uuid.uuid4().hex[:12]}", **params}.items())
    return f"aerospike://{HOSTS}/{NAMESPACE}?{query}"


def aerospike_host() -> tuple[str, int]:
    host, port = HOSTS.split(",")[0].rsplit(":", 1)
    return host, int(port)


def drop_set(client: object, url: str) -> None:
    """Empty the set `url` names (one this test made), and the store's lock and meta sets."""
    set_name = url.split("set=", 1)[1].split("&", 1)[0]
    for name in (set_name, f"{set_name}_lock", f"{set_name}_meta"):
        client.truncate(NAMESPACE, name, 0)  # type: ignore[attr-defined]
