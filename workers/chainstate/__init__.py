"""The chain applied to the UTXO store (Bitcoin Core's word for it: its Chainstate connects and
disconnects blocks against the coins): the block index, the sequencer that holds the chain's
lease (apply, take off, reorg, batches, an operator's verdicts), block application and its
shared units, blocks prepared ahead, the commitment, conflicts, mempool transactions, and the
store pairing check."""
