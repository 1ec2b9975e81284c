"""UTXO snapshots: the file `utxo export-utxos` writes and `utxo import-utxos` reads
(`fileformat`), and its checked entries spooled on disk before anything is imported (`spool`)."""
