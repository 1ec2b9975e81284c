"""What an operator sees: Prometheus metrics of each worker process and of the whole deployment,
the `utxo status` snapshot, recent activity rates, and JSON log lines."""
