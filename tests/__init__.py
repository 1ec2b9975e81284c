"""The test suite: real PostgreSQL, real files, real processes, real mainnet data (tests/data).

`chain/` parses real blocks; `stores/` is one conformance suite run on every backend; `cli/` runs `utxo`."""
