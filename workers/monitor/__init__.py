"""What `utxo status` and `utxo metrics` show of the whole deployment: the snapshot gathered from
the stores and the broker (`cluster`), drawn for a terminal (`screen`), exported to Prometheus
(`exposition`)."""
