"""What `utxo demo` runs on one machine: its chain generator, a private Redis server, and the
supervisor of the processes it starts. Nothing else imports this room."""
