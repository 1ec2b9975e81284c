"""The UTXO store conformance suite: every test runs on every backend (see conftest.BACKENDS)."""
