"""Spends on Aerospike (being written)."""

from __future__ import annotations

from stores.utxo.aerospike.create import CreateMixin


class SpendMixin(CreateMixin):
    pass
