"""Pruning on Aerospike (being written): delete-at-height queries, pruning, preservations."""

from __future__ import annotations

from stores.utxo.aerospike.create import CreateMixin


class PruneMixin(CreateMixin):
    pass
