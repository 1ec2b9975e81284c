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


# A backend's own default batch size for a new store, where the settings' default does not suit it
# (an Aerospike record is rewritten whole by every spend and capped at 1 MiB: bench.pagesize)
BATCH_SIZES: dict[str, str] = {"aerospike": "stores.utxo.aerospike.codec:DEFAULT_BATCH_SIZE"}


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def default_batch_size(url: str) -> int | None:
    """The batch size a new store of this URL's backend defaults to, where it has its own."""
    target = BATCH_SIZES.get(scheme_of(url))
    if target is None:
        return None
    module, name = target.split(":")
    return int(getattr(importlib.import_module(module), name))


def open_utxo_store(url: str, **opts: Any) -> UtxoStore:
    """`opts`: retention (blocks a fully spent record is kept), batch_size (outputs per record)."""
    scheme = scheme_of(url)
    target = BACKENDS.get(scheme)
    if target is None:
        known = ", ".join(sorted(BACKENDS))
        raise ValueError(f"unknown UTXO store URL scheme {scheme or url!r} (known: {known})")
    module, cls = target.split(":")
    store: UtxoStore = getattr(importlib.import_module(module), cls)(url, **opts)
    return store
