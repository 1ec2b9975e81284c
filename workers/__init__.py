"""The logic that decides what runs when: settings, the `utxo` CLI, and (with the pipeline) the
Celery app and the coordinators (chain sequencer, pruner job manager, recovery manager)."""
