"""The record kernel: one `Record` type and every rule of the data model, as plain functions over
it, in one place each — the specification every backend runs (SQL by loading records under
lock, calling these, writing back what they touched; Aerospike as a Lua port of them).

| rule | home |
|---|---|
| the UTXO hash, data carriers | `chain.utxo` (`utxo_hash`, its fast form `utxo_hashes`) |
| new records: slots, pages, coinbase maturity, creating | `kernel.create` |
| spend checks (and their fast form), unspend, GetSpend | `kernel.spend` |
| freeze, unfreeze, reassign | `kernel.outputs` |
| delete-at-height (and its SQL fast form) | `kernel.dah` |
| set-mined, longest chain, locked, conflicting, preserve, deleted children | `kernel.marks` |
"""
