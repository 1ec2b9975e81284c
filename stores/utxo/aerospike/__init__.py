"""The Aerospike backend of the UTXO store: the record kernel ported to a Lua module
(`utxoflow.lua`, called per record by `rules.py`), the bins codec, and the cluster connection."""
