"""The `utxo` command as a user runs it: real processes, SQLite and PostgreSQL stores."""
