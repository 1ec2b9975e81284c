"""The chain applied to the UTXO store: the block index, the sequencer that holds the chain's
lease (apply, disconnect, reorg, batches), block application and its shared units, blocks
prepared ahead, the commitment, conflicts, mempool transactions, and the store pairing check."""
