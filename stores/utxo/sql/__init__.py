"""The SQL implementation shared by the SQLite and PostgreSQL backends.

Each operation reads the records it changes under a write lock (SQLite: BEGIN IMMEDIATE;
PostgreSQL: SELECT … FOR UPDATE in txid order), decides with `stores.utxo.rules`, and writes the
result back in batched statements — so the rules exist once and both databases agree.
"""
