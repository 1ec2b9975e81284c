"""Storage: the UTXO store (`stores.utxo`), and later the blob and state stores.

Nothing here knows about Celery; each store kind has one Protocol and a backend per module, chosen by URL.
"""
