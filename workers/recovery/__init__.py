"""The recovery manager (the transaction-recovery service's design): leader election, leased claims
of what a crash left behind, and giving back what dead workers and lost messages held; run inside
workers and by `utxo recover`."""
