"""Tables of the SQL UTXO store.

Design (why it looks like this):
- Two tables only. `txs` holds one row per transaction (the record's metadata, block list and
  counters); `outputs` one row per UTXO slot, with its spending data inline. There is no separate
  spend index: a spend lives in its output's row and goes when the transaction is pruned, so the
  store does not grow an index that slows every later write.
- Data carriers (zero-satoshi OP_RETURN) get no `outputs` row; `total_utxos` counts real slots.
- Pruning reads partial indexes on `delete_at_height`, `unmined_since` and `preserve_until`,
  which hold only the few rows that have those set.
- Booleans are SMALLINT 0/1 on both databases so the same statements run on both.
"""

from __future__ import annotations

TXS = """
CREATE TABLE IF NOT EXISTS txs (
    txid {blob} PRIMARY KEY,
    version BIGINT NOT NULL,
    locktime BIGINT NOT NULL,
    fee BIGINT,
    size_in_bytes BIGINT NOT NULL,
    is_coinbase SMALLINT NOT NULL,
    spending_height INTEGER NOT NULL,
    locked SMALLINT NOT NULL,
    creating SMALLINT NOT NULL,
    conflicting SMALLINT NOT NULL,
    unmined_since INTEGER,
    created_at BIGINT NOT NULL,
    preserve_until INTEGER,
    delete_at_height INTEGER,
    external SMALLINT NOT NULL,
    total_extra_recs INTEGER NOT NULL,
    total_utxos INTEGER NOT NULL,
    spent_utxos INTEGER NOT NULL,
    blocks TEXT NOT NULL,
    conflicting_children {blob} NOT NULL,
    reassignments TEXT NOT NULL,
    inpoints {blob} NOT NULL,
    raw {blob}
){table_opts}
"""

OUTPUTS = """
CREATE TABLE IF NOT EXISTS outputs (
    txid {blob} NOT NULL,
    vout INTEGER NOT NULL,
    utxo_hash {blob} NOT NULL,
    satoshis BIGINT NOT NULL,
    script {blob} NOT NULL,
    spending_txid {blob},
    spending_vin INTEGER,
    frozen SMALLINT NOT NULL,
    spendable_in INTEGER,
    PRIMARY KEY (txid, vout)
){table_opts}
"""

META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

INDEXES = [
    "CREATE INDEX IF NOT EXISTS txs_dah ON txs (delete_at_height) WHERE delete_at_height IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS txs_unmined ON txs (unmined_since) WHERE unmined_since IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS txs_preserve ON txs (preserve_until) WHERE preserve_until IS NOT NULL",
]


def ddl(blob: str, table_opts: str) -> list[str]:
    return [
        TXS.format(blob=blob, table_opts=table_opts),
        OUTPUTS.format(blob=blob, table_opts=table_opts),
        META,
        *INDEXES,
    ]
