"""The logic that decides what runs when: settings, the `utxo` CLI, the Celery app, the chain
sequencer and block application, ingest, the pruner's job manager and the recovery manager."""
