"""Tables of the SQL UTXO store.

Design (why it looks like this):
- One row per record, as the data model has it: `txs` holds a transaction's metadata, block
  list, counters and its UTXO slots packed in `utxos` (see `stores.utxo.slots`), with spending
  data inline. A spend rewrites one row of its parent; there is no separate spend index to grow,
  and a pruned record takes its spends with it.
- Rows are keyed by a small increasing integer `id` (SQLite's rowid), so inserts append instead
  of landing at random points of a B-tree keyed by hash; `txid` has its own unique index.
  Measured on SQLite, a row per output (the first design) wrote 3 rows per 2-output tx and could
  not pass ~40k tx/s even as plain inserts; one row per tx more than doubles that limit.
- `raw` keeps the standard transaction (raw_format 1) or, for snapshot records that have no
  transaction, the outputs they hold (raw_format 2): enough to list UTXOs with script and value.
- Pruning reads partial indexes on `delete_at_height`, `unmined_since` and `preserve_until`,
  which hold only the few rows that have those set.
- A transaction with more outputs than the batch size keeps outputs B… in `tx_pages`, one row
  per child record (see `stores.utxo.kernel.create`); a child is removed with its master. Its own
  `total_utxos`/`spent_utxos` count its slots, while the master's count the whole transaction.
- `deleted_children` lists the children pruned since they spent an output here (32-byte txids):
  one of them spending again is a replay, refused (INVALID_SPEND).
- Booleans are SMALLINT 0/1 on both databases so the same statements run on both.
- The columns of a record, in order, are `stores.utxo.sql.codec`'s: the one place a row becomes
  a `Record` and back.
"""

from __future__ import annotations

TXS = """
CREATE TABLE IF NOT EXISTS txs (
    id {bigint} PRIMARY KEY,
    txid {blob} NOT NULL UNIQUE,
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
    deleted_children {blob} NOT NULL,
    reassignments TEXT NOT NULL,
    spendable_in TEXT NOT NULL,
    inpoints {blob} NOT NULL,
    utxos {blob} NOT NULL,
    script_keys {blob} NOT NULL,
    raw_format SMALLINT NOT NULL,
    raw {blob}
){opts}
"""

PAGES = """
CREATE TABLE IF NOT EXISTS tx_pages (
    txid {blob} NOT NULL,
    page INTEGER NOT NULL,
    creating SMALLINT NOT NULL,
    total_utxos INTEGER NOT NULL,
    spent_utxos INTEGER NOT NULL,
    utxos {blob} NOT NULL,
    script_keys {blob} NOT NULL,
    PRIMARY KEY (txid, page)
)
"""

# How an unfinished multi-record creation was asked for (JSON: frozen, locked, conflicting, …),
# written with its master and removed when the master's `creating` flag clears: recovery
# rebuilds missing pages exactly as the creator would have.
CREATIONS = """
CREATE TABLE IF NOT EXISTS tx_creations (
    txid {blob} PRIMARY KEY,
    options TEXT NOT NULL
)
"""

# The script index (`stores.utxo.scriptindex`): an entry per unspent output, by the key of its
# script, then its place in the store (the record's `id`, its vout) — the order pages go in.
# Written in the same unit as the record change that makes or ends the output. Only the key
# and the place: all an entry shows is read from its record.
SCRIPTS = """
CREATE TABLE IF NOT EXISTS script_utxos (
    sh BIGINT NOT NULL,
    rid BIGINT NOT NULL,
    vout BIGINT NOT NULL,
    PRIMARY KEY (sh, rid, vout)
){index_opts}
"""

META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

# Lock records of two-phase creation (Teranode's lock-record pattern): create-only, one per txid,
# with an expiry so a dead holder's lock lapses. Kept apart from `txs` so a lock never looks like a
# record.
LOCKS = """
CREATE TABLE IF NOT EXISTS tx_locks (
    txid {blob} PRIMARY KEY,
    lock_type TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    process_id INTEGER NOT NULL,
    hostname TEXT NOT NULL,
    expected_recs INTEGER NOT NULL,
    options TEXT NOT NULL
)
"""

INDEXES = [
    # (delete-at-height, id): the order the pruner walks due records in, with no sort
    "DROP INDEX IF EXISTS txs_dah",
    "CREATE INDEX IF NOT EXISTS txs_dah_id ON txs (delete_at_height, id) WHERE delete_at_height IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS txs_unmined ON txs (unmined_since) WHERE unmined_since IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS txs_preserve ON txs (preserve_until) WHERE preserve_until IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS txs_creating ON txs (txid) WHERE creating = 1",
]


def ddl(
    blob: str, bigint: str, opts: str = "", extra: tuple[str, ...] = (), index_opts: str = ""
) -> list[str]:
    return [
        *extra,
        TXS.format(blob=blob, bigint=bigint, opts=opts),
        SCRIPTS.format(index_opts=index_opts),
        PAGES.format(blob=blob),
        CREATIONS.format(blob=blob),
        META,
        LOCKS.format(blob=blob),
        *INDEXES,
    ]
