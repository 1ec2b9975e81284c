"""The SQL store the SQLite and PostgreSQL backends share (`store.py` lists its modules).

Each operation loads the records it changes under a write lock through one codec, lets the
record kernel (`stores.utxo.kernel`) decide, and writes back what the kernel touched.
"""
