"""A worker's Celery runtime: the app, ingest (what `utxo enqueue` checks, stores and sends), the
stores a process opens once, the registry of pending messages, start-up checks, and the process
map that spreads a large input's checks over cores."""
