"""Finishing what a crash or a lost message left behind: the recovery manager (leader election,
leased claims, handlers, workers' liveness; run inside workers and by `utxo recover`) and the
re-sending of messages a broker lost (`requeue`)."""
