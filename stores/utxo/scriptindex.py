"""The script index: the unspent outputs a locking script owns, found in O(results) — the one
statement of what it holds and shows, which every backend keeps (tests/stores/test_scriptindex.py).

Invariants:
- An entry per output in the store's view of unspent outputs: a UTXO slot (not a data carrier)
  that is unspent or frozen. It is made with its record (create, snapshot import; for a
  multi-record transaction, when its creation completes), removed by a spend, made again by an
  unspend, and goes with its record (pruned, or deleted when a refused block is taken back).
  An output spent by an unconfirmed transaction has no entry: it is spent, as Electrum's
  `listunspent` has it.
- An entry is keyed by `script_key` (the first 8 bytes of the script's SHA-256) and the output's
  place in the store (its record's id, then its vout), and pages go in that order: the order
  outputs reached the store, so a cursor handed out stays valid — whatever arrives later, and a
  transaction mined later, sorts after it. (One window: a record id is drawn before its write
  commits, so a record being written while a page is read, under an id below that page's last,
  is passed over by that walk; the next walk lists it.)
- On SQLite the entries of the newest records may not be written yet: a query finds those by
  a bounded scan of their keys instead (`stores.utxo.sql.scriptindex`), and lists the same.
- Everything an entry shows is read from its record when it is listed (`listed`): the script (an
  entry whose script does not hash to the one asked for is a collision of the key, skipped), the
  satoshis, height and coinbase flag, and whether it is confirmed (its transaction mined on the
  best chain). A record that is conflicting or not fully created lists nothing. So mining, a
  reorg or a conflict change no entry: only spends, unspends and records coming and going do.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256
from typing import Any

from stores.utxo import slots
from stores.utxo.errors import ProcessingError
from stores.utxo.kernel.record import Record
from stores.utxo.values import Utxo

PAGE_LIMIT = 10_000  # entries per page at most


def scripthash(script: bytes) -> bytes:
    """SHA-256 of a locking script (internal order): Electrum's "scripthash", shown reversed."""
    return sha256(script).digest()


def script_key(h: bytes) -> int:
    """The index key of a scripthash: its first 8 bytes as a signed 64-bit integer (what a SQL
    BIGINT holds), the rest checked against the script when an entry is listed."""
    return int.from_bytes(h[:8], "little", signed=True)


@dataclass(frozen=True, slots=True)
class ScriptUtxo:
    """One unspent output of a script, as `utxo utxos --address/--script/--scripthash` lists it."""

    utxo: Utxo
    confirmed: bool  # its transaction is mined on the best chain
    cursor: str  # the listing goes on after it from here (`script_utxos(after=…)`)

    def json_line(self) -> str:
        return (self.utxo.json_line()[:-2]
                + f', "confirmed": {"true" if self.confirmed else "false"}, "cursor": "{self.cursor}"}}\n')


@dataclass(frozen=True, slots=True)
class Balance:
    confirmed: int  # satoshis of confirmed unspent outputs
    unconfirmed: int  # satoshis of unspent outputs of transactions not mined on the best chain
    utxos: int

    def to_json(self) -> dict[str, Any]:
        return {"confirmed": self.confirmed, "unconfirmed": self.unconfirmed, "utxos": self.utxos}


def cursor(position: tuple[int, int]) -> str:
    """The opaque cursor after an entry at (record id, vout)."""
    return f"{position[0]}.{position[1]}"


def parse_cursor(text: str | None) -> tuple[int, int]:
    """The (record id, vout) a cursor names; (-1, -1) before the first. ProcessingError if it is
    not one this store handed out."""
    if text is None:
        return -1, -1
    rid, sep, vout = text.partition(".")
    if not sep or not rid.isdigit() or not vout.isdigit():
        raise ProcessingError(f"not a cursor of the script index: {text[:80]!r}")
    return int(rid), int(vout)


def check_limit(limit: int) -> None:
    if not 1 <= limit <= PAGE_LIMIT:
        raise ProcessingError(f"a page holds 1 to {PAGE_LIMIT} outputs, not {limit}")


def listed(
    rec: Record | None, vout: int, output: tuple[int, bytes] | None, wanted: bytes, at: str,
    batch_size: int,
) -> ScriptUtxo | None:
    """What an entry shows (see the module), or None when it shows nothing: its record gone or
    conflicting or being created, the output spent since the entry was read (where its slot is
    loaded), unknown, or its script not the one asked for. `at`: the entry's cursor."""
    if rec is None or rec.conflicting or rec.creating or output is None:
        return None
    loc = rec.locate(vout, batch_size)
    if loc is not None and not slots.is_live(loc[0].utxos, loc[1]):
        return None
    sats, script = output
    if sha256(script).digest() != wanted:
        return None
    return ScriptUtxo(Utxo(rec.txid, vout, sats, script, rec.height(), rec.is_coinbase), rec.mined, at)


class ScriptBalance:
    """`script_balance` over a backend's `script_utxos`, a page at a time (memory stays bounded
    however many outputs the script has)."""

    def script_utxos(
        self, scripthash: bytes, *, after: str | None = None, limit: int = 1000, confirmed: bool = False
    ) -> tuple[list[ScriptUtxo], str | None]:
        raise NotImplementedError

    def script_balance(self, scripthash: bytes) -> Balance:
        conf = unconf = n = 0
        after: str | None = None
        while True:
            items, after = self.script_utxos(scripthash, after=after, limit=PAGE_LIMIT)
            for u in items:
                if u.confirmed:
                    conf += u.utxo.satoshis
                else:
                    unconf += u.utxo.satoshis
            n += len(items)
            if after is None:
                return Balance(conf, unconf, n)
