"""The logic that decides what runs when: settings, the `utxo` CLI, the Celery app, the chain
sequencer and block application, ingest; later the pruner job manager and recovery manager."""
