"""The processes around the stores, one room per concern, arrows running down: `cli` (the `utxo`
command) and `hooks` (a worker's wiring) on top; `monitor`, `snapshots`, `recovery`, `runtime`
(the Celery app, ingest, a process's services), `chainstate` (the chain applied to the store)
and `pruning`; `broker`, `ops` (each process's instruments) and `settings` below; `demo` beside."""
