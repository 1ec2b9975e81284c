"""Storage: the UTXO store (`stores.utxo`), the blob store (`stores.blob`) and the state store
(`stores.state`). Nothing here knows about Celery; each store kind has one Protocol and a
backend per module, chosen by URL.
"""
