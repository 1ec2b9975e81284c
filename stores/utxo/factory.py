"""Open a UTXO store by URL: one small table of schemes → backend modules, imported lazily
(so `aerospike` is needed only by those who use it)."""

from __future__ import annotations

import importlib
from typing import Any

from stores.utxo.protocol import UtxoStore

BACKENDS: dict[str, str] = {
    "sqlite": "stores.utxo.sqlite:SqliteUtxoStore",
    "postgresql": "stores.utxo.postgresql:PostgresUtxoStore",
    "postgres": "stores.utxo.postgresql:PostgresUtxoStore",
    "postgresql+psycopg": "stores.utxo.postgresql:PostgresUtxoStore",
    "aerospike": "stores.utxo.aerospike.store:AerospikeUtxoStore",
}


def open_utxo_store(url: str, **opts: Any) -> UtxoStore:
    """`opts`: retention (blocks a fully spent record is kept), batch_size (outputs per record)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    target = BACKENDS.get(scheme)
    if target is None:
        known = ", ".join(sorted(BACKENDS))
        raise ValueError(f"unknown UTXO store URL scheme {scheme or url!r} (known: {known})")
    module, cls = target.split(":")
    store: UtxoStore = getattr(importlib.import_module(module), cls)(url, **opts)
    return store
