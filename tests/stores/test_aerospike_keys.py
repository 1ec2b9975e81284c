"""Aerospike's Python client takes a `bytes` key for a NUL-terminated string: two txids that
agree up to their first zero byte would be one record, and a master would share its key with its
own child pages. The store's keys must keep every byte. Needs AEROSPIKE_HOSTS."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.aerospike_server import drop_set, needs_aerospike, new_url

pytestmark = needs_aerospike


@pytest.fixture
def conn() -> Iterator[Any]:
    from stores.utxo.aerospike.client import Connection

    url = new_url()
    c = Connection(url)
    yield c
    drop_set(c.client, url)
    c.close()


def test_txids_that_agree_up_to_a_zero_byte_are_distinct_records(conn: Any) -> None:
    a = b"\x11\x22\x00" + b"\xaa" * 29
    b = b"\x11\x22\x00" + b"\xbb" * 29
    conn.client.put(conn.key(a), {"v": 1})
    conn.client.put(conn.key(b), {"v": 2})
    conn.client.put(conn.key(a, 1), {"v": 3})
    got = [conn.client.get(conn.key(t, p))[2]["v"] for t, p in ((a, 0), (b, 0), (a, 1))]
    assert got == [1, 2, 3]
