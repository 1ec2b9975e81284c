"""Reads on Aerospike (being written): records, outputs, GetSpend, the UTXO views."""

from __future__ import annotations

from stores.utxo.aerospike.create import CreateMixin


class ReadMixin(CreateMixin):
    pass
