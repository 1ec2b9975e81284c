"""The pipeline: the chain sequencer over real stores (every backend), generated chains checked
against an independent model, real `utxo worker` processes on a real Redis, and their faults."""
