"""The one codec between a `txs` / `tx_pages` row and a `Record`: which columns a read loads (a
`Projection`, declared by name), how a row becomes a record, and how a record's changes are
written back.

Invariants:
- A column is named as the `Record` field it holds, and a projection's decoder is generated from
  its names: the mapping between rows and records is stated once and cannot drift.
- `FULL` is every column of a record; a row of `txs` adds `raw_format` and `raw` after them (the
  transaction bytes, or a snapshot's outputs), which only reads of the transaction need.
  `RULES` leaves out the metadata no rule reads, `SPENDS` also what spends do not touch. A
  field a projection does not load is left unset on the record (reading it raises), and such
  a record is `partial`: never handed out (`meta_of` refuses it).
- Booleans are stored as 0/1; list-valued fields as the kernel keeps them (JSON text,
  concatenated hashes), so decoding a row costs no parsing.
- An update writes exactly the columns the kernel touched (`Record.dirty`), grouped so that
  records changed alike share one statement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from stores.utxo.kernel.record import Record

RECORD_COLS = (
    "id", "txid", "version", "locktime", "fee", "size_in_bytes", "is_coinbase", "spending_height",
    "locked", "creating", "conflicting", "unmined_since", "created_at", "preserve_until",
    "delete_at_height", "external", "total_extra_recs", "total_utxos", "spent_utxos", "blocks",
    "conflicting_children", "deleted_children", "reassignments", "spendable_in", "inpoints", "utxos",
    "script_keys",
)  # fmt: skip
TX_COLS = (*RECORD_COLS, "raw_format", "raw")
INSERT_TX = (
    f"INSERT INTO txs ({', '.join(TX_COLS)}) VALUES ({', '.join('?' * len(TX_COLS))}) "
    "ON CONFLICT (txid) DO NOTHING"
)
# The same rows through PostgreSQL's COPY (`stores.utxo.postgresql`): every column a value.
COPY_TX = f"COPY txs ({', '.join(TX_COLS)}) FROM STDIN"
PAGE_COLS = ("txid", "page", "creating", "total_utxos", "spent_utxos", "utxos", "script_keys")
INSERT_PAGE = (
    f"INSERT INTO tx_pages ({', '.join(PAGE_COLS)}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (txid, page) DO NOTHING"
)
_BOOLS = frozenset({"is_coinbase", "locked", "creating", "conflicting", "external"})
_METADATA = ("version", "locktime", "fee", "size_in_bytes", "created_at")  # read by no rule
_NOT_SPENT = ("external", "conflicting_children", "reassignments", "inpoints")  # nor by a spend

RAW_NONE, RAW_TX, RAW_OUTPUTS = 0, 1, 2  # raw_format: none (external), a tx, a snapshot's outputs


def _decoder(cols: tuple[str, ...], page: bool) -> Callable[[tuple[Any, ...]], Record]:
    """A function from a row of `cols` to a record: the row unpacked straight into the record's
    attributes (twice as fast as the dataclass's constructor: a block's spends load a record
    per parent), booleans from 0/1, the slots into a mutable buffer."""
    targets = ", ".join(f"_{c}" if c in _BOOLS or c == "utxos" else f"rec.{c}" for c in cols)
    lines = [
        "def decode(r):",
        "    rec = _new(Record)",
        f"    ({targets},) = r[:{len(cols)}]",
        *[f"    rec.{c} = _{c} == 1" for c in cols if c in _BOOLS],
        *(["    rec.utxos = bytearray(_utxos)"] if "utxos" in cols else []),
        *([] if page else ["    rec.page = 0"]),
        "    rec.pages = {}",
        "    rec.dirty = set()",
        f"    rec.partial = {set(RECORD_COLS) - set(cols) != set() and not page}",
        "    return rec",
    ]
    scope: dict[str, Any] = {"_new": object.__new__, "Record": Record}
    exec("\n".join(lines), scope)  # generated from the column names above, nothing else
    decode: Callable[[tuple[Any, ...]], Record] = scope["decode"]
    return decode


class Projection:
    """Which columns a read of records loads, and how its rows decode."""

    def __init__(self, cols: tuple[str, ...], page: bool = False) -> None:
        self.cols = cols
        self.select = ", ".join(cols)
        self.decode = _decoder(cols, page)


FULL = Projection(RECORD_COLS)
RULES = Projection(tuple(c for c in RECORD_COLS if c not in _METADATA))
SPENDS = Projection(tuple(c for c in RECORD_COLS if c not in _METADATA + _NOT_SPENT))
PAGE = Projection(PAGE_COLS, page=True)
# `FULL` decoded (a row of `txs` with the transaction's columns after it: ignored here)
record = FULL.decode


def values(rec: Record, raw_format: int = RAW_NONE, raw: bytes | None = None) -> list[Any]:
    """`INSERT_TX`'s values for a new master record (its id first, to be filled in)."""
    return [
        rec.id,
        rec.txid,
        rec.version,
        rec.locktime,
        rec.fee,
        rec.size_in_bytes,
        int(rec.is_coinbase),
        rec.spending_height,
        int(rec.locked),
        int(rec.creating),
        int(rec.conflicting),
        rec.unmined_since,
        rec.created_at,
        rec.preserve_until,
        rec.delete_at_height,
        int(rec.external),
        rec.total_extra_recs,
        rec.total_utxos,
        rec.spent_utxos,
        rec.blocks,
        rec.conflicting_children,
        rec.deleted_children,
        rec.reassignments,
        rec.spendable_in,
        rec.inpoints,
        bytes(rec.utxos),
        rec.script_keys,
        raw_format,
        raw,
    ]


def page_values(rec: Record) -> tuple[Any, ...]:
    return (rec.txid, rec.page, int(rec.creating), rec.total_utxos, rec.spent_utxos, bytes(rec.utxos),
            rec.script_keys)


Update = tuple[str, Callable[[Record], Any], tuple[int, ...]]
_UPDATES: dict[tuple[frozenset[str], bool], Update] = {}
# statement -> (table, the columns it sets, the key columns): what a backend needs to write the
# same rows its own way (PostgreSQL: one statement over arrays)
SHAPES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {}


def _update(names: frozenset[str], master: bool) -> Update:
    """(statement, getter of its values, positions of booleans among them) for one set of
    touched columns (kept: a store sees a few dozen sets at most)."""
    cached = _UPDATES.get((names, master))
    if cached is not None:
        return cached
    cols = sorted(names)
    sets = ", ".join(f"{n} = ?" for n in cols)
    where = "id = ?" if master else "txid = ? AND page = ?"
    sql = f"UPDATE {'txs' if master else 'tx_pages'} SET {sets} WHERE {where}"
    getter = attrgetter(*cols, "id") if master else attrgetter(*cols, "txid", "page")
    SHAPES[sql] = ("txs" if master else "tx_pages", tuple(cols), ("id",) if master else ("txid", "page"))
    made = _UPDATES[(names, master)] = (sql, getter, tuple(i for i, n in enumerate(cols) if n in _BOOLS))
    return made


def updates(records: Iterable[Record]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """(statement, rows) that write the touched columns of these records (masters by id, pages
    by key), one statement per set of touched columns."""
    groups: dict[str, list[tuple[Any, ...]]] = {}
    for rec in records:
        if not rec.dirty:
            continue
        sql, getter, bools = _update(frozenset(rec.dirty), rec.page == 0)
        row = getter(rec)
        if bools:
            vals = list(row)
            for i in bools:
                vals[i] = int(vals[i])
            row = tuple(vals)
        rows = groups.get(sql)
        if rows is None:
            rows = groups[sql] = []
        rows.append(row)
    return list(groups.items())


# -- a block's worth of new records in one statement ------------------------------------------
# The columns every new record of one create call shares are written as literals, which halves
# the parameters bound per row; each row binds the rest. (`create_insert` checks the literals.)
CREATE_COLS = (
    "id",
    "txid",
    "version",
    "locktime",
    "fee",
    "size_in_bytes",
    "is_coinbase",
    "spending_height",
    "total_utxos",
    "delete_at_height",
    "inpoints",
    "utxos",
    "raw",
    "created_at",
    "script_keys",
)
SHARED_COLS = (
    "locked",
    "creating",
    "conflicting",
    "unmined_since",
    "preserve_until",
    "external",
    "total_extra_recs",
    "spent_utxos",
    "blocks",
    "reassignments",
    "spendable_in",
    "raw_format",
    "conflicting_children",
    "deleted_children",
)


COPY_CREATE = f"COPY txs ({', '.join(CREATE_COLS)}, {', '.join(SHARED_COLS)}) FROM STDIN"


def create_insert(like: Record, empty_blob: str) -> str:
    """The INSERT of one create call whose records all share `like`'s values of SHARED_COLS (a
    new one-record transaction: nothing spent, preserved, listed, reassigned or external)."""
    if not all(c in "0123456789[],-" for c in like.blocks):
        raise ValueError(f"unexpected block list {like.blocks!r}")
    assert not (
        like.preserve_until is not None
        or like.external
        or like.total_extra_recs
        or like.spent_utxos
        or like.conflicting_children
        or like.deleted_children
        or like.reassignments != "[]"
        or like.spendable_in != "{}"
    ), "not a new one-record transaction"
    shared = ", ".join(_literal(v, empty_blob) for v in create_shared(like))
    return (
        f"INSERT INTO txs ({', '.join(CREATE_COLS)}, {', '.join(SHARED_COLS)}) "
        f"VALUES ({', '.join('?' * len(CREATE_COLS))}, {shared}) ON CONFLICT (txid) DO NOTHING"
    )


def create_shared(like: Record) -> tuple[Any, ...]:
    """The values of SHARED_COLS every record of a create call shares, in their order: SQL
    literals in `create_insert`, values of every row in COPY_CREATE."""
    unmined = None if like.unmined_since is None else int(like.unmined_since)
    return (int(like.locked), int(like.creating), int(like.conflicting), unmined, None, 0, 0, 0,
            like.blocks, "[]", "{}", RAW_TX, b"", b"")


def _literal(value: Any, empty_blob: str) -> str:
    """A shared value as SQL (its strings checked by `create_insert`: no quotes in them)."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        assert value == b"", value
        return empty_blob
    if isinstance(value, str):
        return f"'{value}'"
    return str(int(value))


def create_values(rec: Record, raw: bytes) -> list[Any]:
    """`create_insert`'s values for one record (its id first, to be filled in)."""
    return [
        0,
        rec.txid,
        rec.version,
        rec.locktime,
        rec.fee,
        rec.size_in_bytes,
        int(rec.is_coinbase),
        rec.spending_height,
        rec.total_utxos,
        rec.delete_at_height,
        rec.inpoints,
        bytes(rec.utxos),
        raw,
        rec.created_at,
        rec.script_keys,
    ]
