"""Crash tests of two-phase creation: real processes, a real SIGKILL (every backend).

A child process creates a transaction that spans three records (batch size 4; 11 outputs, so
pages 0 and 1 hold 4 slots and page 2 holds 3; vout 6, in page 1, is a data carrier's empty
slot) and parks at one point of the protocol (wrapped on its store by the creating script).
The test then kills it — or, on the lock-expiry path, leaves it parked, alive and stuck — and shows:

(a) no output of the half-made transaction can be spent, and the failed attempt spends nothing;
then recovers by one of three paths, each its own test: a retried create (by another worker
process), set-mined, or a takeover once the stuck holder's creation lock has lapsed; and shows
(b) the transaction is complete and every output is spendable (all of them are spent), and
(c) in the database itself, that nothing was duplicated or lost: one master row, every page
once, every slot once with the right content, and counters that agree with the slots.

The last tests show that a recovery from the blob alone rebuilds the transaction with the
options its creator asked for (frozen, conflicting), which the creator's lock row keeps.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chain import Tx, TxIn, utxo_hash
from chain.build import build_tx, spend_input
from stores.blob.protocol import blob_key
from stores.state import open_state_store
from stores.utxo import (
    SpendRejected,
    SpendStatus,
    TxExists,
    TxNotFound,
    UtxoSpent,
    UtxoStore,
    open_utxo_store,
)
from stores.utxo.sqlite import sqlite_path
from tests.stores.helpers import script

ROOT = Path(__file__).resolve().parents[2]

BATCH = 4
N_OUTPUTS = 11
CARRIER = 6  # a zero-value OP_RETURN: it keeps its slot position but holds no UTXO
PAGES = 3  # ceil(11 / 4): the master (page 0) and two children
REAL = [v for v in range(N_OUTPUTS) if v != CARRIER]
FEE = 1000
HEIGHT = 100
BLOCK_ID = 7
SLOT = 68
UNSPENT = b"\x00" * 36
PROBES = (0, 4, 10)  # one output of each page: spend attempts before recovery

POINTS = [
    "after_lock",
    "after_blob",
    "after_page:1",
    "after_page:2",
    "after_page:3",
    "between_phases",
    "mid_phase2",
]
NO_MASTER = {"after_lock", "after_blob"}  # the killed creator wrote no record
LOCK_HELD = {"after_lock", "after_blob", "after_page:1", "after_page:2", "after_page:3"}

Ttl = tuple[float, float, float]  # lock_base_ttl, lock_per_record_ttl, lock_max_ttl
Proc = subprocess.Popen[bytes]
Options = dict[str, bool]  # keyword options of the child's create (frozen, conflicting, locked)
DEFAULT_TTL = (30.0, 2.0, 300.0)  # the store's own: a lock of 3 records lives 36 s
FAST_TTL = (1.0, 0.0, 1.0)  # lock-expiry path: a lock lives 1 s

PARK_ENV, PARK_FILE_ENV = "UTXOFLOW_TEST_PARK", "UTXOFLOW_TEST_PARK_FILE"

# The creating process: opens the same store and creates the transaction once; prints the outcome
# as one JSON line. With UTXOFLOW_TEST_PARK set it never gets that far: it parks at that point of
# the protocol — after the record-level call that ends there, wrapped on this store (the code
# under test reads no test setting).
CHILD = """
import json, os, sys, time
from chain import parse_tx
from stores.utxo import UtxoError, open_utxo_store

url, blob_url, base, per, cap, batch, height, raw, options = sys.argv[1:10]
store = open_utxo_store(
    url, batch_size=int(batch), blob_url=blob_url, lock_base_ttl=float(base),
    lock_per_record_ttl=float(per), lock_max_ttl=float(cap),
)
point = os.environ.get("UTXOFLOW_TEST_PARK")

def park():
    with open(os.environ["UTXOFLOW_TEST_PARK_FILE"], "w") as f:
        f.write(f"{os.getpid()} {point}\\n")
    while True:
        time.sleep(3600)

def then_park(owner, name, when=lambda out, *a: True):
    call = getattr(owner, name)
    def wrapped(*args, **kwargs):
        out = call(*args, **kwargs)
        if when(out, *args):
            park()
        return out
    setattr(owner, name, wrapped)

if point == "after_lock":
    then_park(store, "acquire_creation_lock", lambda lock, *a: lock is not None)
elif point == "after_blob":
    then_park(store.external, "put_tx")
elif point == "after_page:1":
    then_park(store, "create_master")
elif point and point.startswith("after_page:"):
    then_park(store, "create_page", lambda out, rec: rec.page + 1 == int(point.split(":")[1]))
elif point == "between_phases":
    then_park(store, "release_creation_lock")
elif point == "mid_phase2":
    then_park(store, "clear_creating_children")
elif point:
    sys.exit(f"no park point {point!r}")
try:
    meta = store.create(parse_tx(bytes.fromhex(raw)), int(height), **json.loads(options))
    print(json.dumps({"ok": True, "creating": meta.creating, "pages": meta.total_extra_recs + 1}))
except UtxoError as e:
    print(json.dumps({"ok": False, "code": e.code, "message": str(e)}))
store.close()
"""


def paged_tx() -> Tx:
    """11 outputs, vout 6 a data carrier; its one input carries its previous output (extended)."""
    outs = [(0, b"\x6a\x04data") if v == CARRIER else (10_000 + v, script()) for v in range(N_OUTPUTS)]
    parent = hashlib.sha256(b"twophase crash test parent").digest()
    value = sum(s for s, _ in outs) + FEE
    return build_tx([TxIn(parent, 0, b"\x51", 0xFFFFFFFF, value, script())], outs)


def expected_slots(tx: Tx, page: int) -> bytes:
    """Page `page`'s slots, all unspent, computed here from the outputs (not by the store)."""
    out = []
    for v in range(page * BATCH, min((page + 1) * BATCH, N_OUTPUTS)):
        o = tx.outputs[v]
        out.append(b"\x00" * SLOT if v == CARRIER else utxo_hash(tx.txid, v, o.script, o.satoshis) + UNSPENT)
    return b"".join(out)


def real_in(page: int) -> int:
    """How many UTXOs (slots that are not data carriers) page `page` holds."""
    return sum(1 for v in REAL if v // BATCH == page)


def uhash(tx: Tx, vout: int) -> bytes:
    o = tx.outputs[vout]
    return utxo_hash(tx.txid, vout, o.script, o.satoshis)


# -- the database, read directly ------------------------------------------------------------------


def query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(url))
        try:
            return [tuple(r) for r in conn.execute(sql, params).fetchall()]
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        return [tuple(r) for r in pg.execute(sql.replace("?", "%s"), params).fetchall()]


@dataclass
class MasterRow:
    creating: int
    total_extra_recs: int
    total_utxos: int
    spent_utxos: int
    utxos: bytes
    blocks: str


@dataclass
class PageRow:
    creating: int
    total_utxos: int
    spent_utxos: int
    utxos: bytes


@dataclass
class Db:
    masters: list[MasterRow]
    pages: dict[int, PageRow]
    lock_pids: list[int]  # process ids of every tx_locks row of the txid, expired or not

    @property
    def master(self) -> MasterRow:
        assert len(self.masters) == 1, f"{len(self.masters)} master rows"
        return self.masters[0]

    def slots(self, page: int) -> bytes:
        return self.master.utxos if page == 0 else self.pages[page].utxos


def read_aerospike(url: str, txid: bytes) -> Db:
    """`read_db` of an Aerospike store: its records read by key with the client itself."""
    from stores.utxo.aerospike.client import parse_url
    from tests.aerospike_server import client

    parts = parse_url(url)
    ns, set_name = parts.namespace, parts.set

    def get(key: bytes) -> dict[str, Any] | None:
        found = client().exists((ns, set_name, bytearray(key)))[1]
        return None if found is None else client().get((ns, set_name, bytearray(key)))[2]

    masters, pages = [], {}
    m = get(txid)
    if m is not None:
        blocks = str([[a, b, c] for a, b, c in zip(m.get("blockIDs", []), m.get("blockHeights", []),
                                                  m.get("subtreeIdxs", []))]).replace(" ", "")  # fmt: skip
        spent = m.get("spentUtxos", 0) + sum(v[1] for v in (m.get("pageSpent") or {}).values())
        masters.append(MasterRow(m.get("creating", 0), m.get("totalExtraRecs", 0), m["recordUtxos"], spent,
                                 bytes(m["utxos"]), blocks))  # fmt: skip
    for k in range(1, 64):  # every page the test's transactions can have, and more
        pg = get(txid + k.to_bytes(4, "little"))
        if pg is not None:
            pages[k] = PageRow(
                pg.get("creating", 0), pg["recordUtxos"], pg.get("spentUtxos", 0), bytes(pg["utxos"])
            )
    lock = get(b"L" + txid)
    return Db(masters, pages, [] if lock is None else [lock["pid"]])


def read_db(url: str, txid: bytes) -> Db:
    if url.startswith("aerospike://"):
        return read_aerospike(url, txid)
    masters = [
        MasterRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5])
        for r in query(
            url,
            "SELECT creating, total_extra_recs, total_utxos, spent_utxos, utxos, blocks FROM txs "
            "WHERE txid = ?",
            txid,
        )
    ]
    rows = query(
        url, "SELECT page, creating, total_utxos, spent_utxos, utxos FROM tx_pages WHERE txid = ?", txid
    )
    pages: dict[int, PageRow] = {}
    for r in rows:
        assert r[0] not in pages, f"page {r[0]} stored twice"
        pages[r[0]] = PageRow(r[1], r[2], r[3], bytes(r[4]))
    locks = [r[0] for r in query(url, "SELECT process_id FROM tx_locks WHERE txid = ?", txid)]
    return Db(masters, pages, locks)


# -- the processes --------------------------------------------------------------------------------


@dataclass
class Case:
    """One test's store, blob directory, transaction and child processes."""

    url: str
    tmp: Path
    tx: Tx = field(default_factory=paged_tx)
    procs: list[Proc] = field(default_factory=list)
    stores: list[UtxoStore] = field(default_factory=list)

    @property
    def txid(self) -> bytes:
        return self.tx.txid

    @property
    def blob_url(self) -> str:
        return f"file://{self.tmp}/blobs"

    @property
    def store(self) -> UtxoStore:
        """The test's own store (the store's default lock TTLs)."""
        return self.stores[0]

    def blob_exists(self) -> bool:
        return (self.tmp / "blobs" / blob_key(self.txid, "tx")).is_file()

    def open(self, ttl: Ttl = DEFAULT_TTL) -> UtxoStore:
        s = open_utxo_store(
            self.url,
            batch_size=BATCH,
            blob_url=self.blob_url,
            lock_base_ttl=ttl[0],
            lock_per_record_ttl=ttl[1],
            lock_max_ttl=ttl[2],
        )
        self.stores.append(s)
        return s

    def db(self) -> Db:
        return read_db(self.url, self.txid)

    def _argv(self, ttl: Ttl, options: Options | None = None) -> list[str]:
        return [
            sys.executable,
            "-c",
            CHILD,
            self.url,
            self.blob_url,
            *(str(t) for t in ttl),
            str(BATCH),
            str(HEIGHT),
            self.tx.serialize(extended=True).hex(),
            json.dumps(options or {}),
        ]

    def _env(self, point: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (PARK_ENV, PARK_FILE_ENV)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        if point is not None:
            env[PARK_ENV] = point
            env[PARK_FILE_ENV] = str(self.tmp / "parked")
        return env

    def park(self, point: str, ttl: Ttl = DEFAULT_TTL, options: Options | None = None) -> Proc:
        """Start a creator (`store.create(tx, HEIGHT, **options)`) that parks at `point`; return
        once it has (it is then alive)."""
        marker = self.tmp / "parked"
        log = self.tmp / "creator.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                self._argv(ttl, options), env=self._env(point), stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text().endswith("\n")):
            if proc.poll() is not None:
                pytest.fail(
                    f"the creator exited ({proc.returncode}) before parking at {point}: {log.read_text()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"the creator did not park at {point} within 60 s: {log.read_text()}")
            time.sleep(0.005)
        assert marker.read_text().split() == [str(proc.pid), point]
        assert proc.poll() is None
        return proc

    def worker_create(self, ttl: Ttl = DEFAULT_TTL, options: Options | None = None) -> dict[str, Any]:
        """The same create by another worker process (no park point), to its end."""
        done = subprocess.run(self._argv(ttl, options), env=self._env(), capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        out: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
        return out


def kill(proc: Proc) -> None:
    """SIGKILL a child and reap it (a reaped process is one `process_alive` sees as gone)."""
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


@pytest.fixture
def case(store_url: str, tmp_path: Path) -> Iterator[Case]:
    c = Case(store_url, tmp_path)
    c.open()  # the schema exists (with batch size 4) before any child opens the store
    try:
        yield c
    finally:
        for p in c.procs:  # only the processes this test started
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        for s in c.stores:
            s.close()


# -- the checks -----------------------------------------------------------------------------------


def check_crash_state(case: Case, point: str, holder: int) -> None:
    """What the creator left at `point`: exactly the records that point promises, each page
    with its exact unspent slots (so nothing of it is spent), and its lock if still held."""
    db = case.db()
    assert case.blob_exists() == (point != "after_lock")
    if point in NO_MASTER:
        assert db.masters == [] and db.pages == {}
    else:
        m = db.master
        assert m.creating == 1  # still creating at every point: the master is cleared last
        assert (m.total_extra_recs, m.total_utxos, m.spent_utxos) == (PAGES - 1, len(REAL), 0)
        assert m.utxos == expected_slots(case.tx, 0)
        children = int(point.split(":")[1]) - 1 if point.startswith("after_page:") else PAGES - 1
        assert sorted(db.pages) == list(range(1, children + 1))
        for k, pg in db.pages.items():
            assert pg.creating == (0 if point == "mid_phase2" else 1)
            assert (pg.total_utxos, pg.spent_utxos) == (real_in(k), 0)
            assert pg.utxos == expected_slots(case.tx, k)
    # The lock is released before phase 2: held only up to after_page:3.
    assert db.lock_pids == ([holder] if point in LOCK_HELD else [])


def check_unspendable(case: Case, store: UtxoStore, point: str) -> None:
    """(a) No output of the half-made transaction can be spent, nor reads as spendable."""
    want = "TX_NOT_FOUND" if point in NO_MASTER else "TX_CREATING"
    probe = build_tx([spend_input(case.tx, v) for v in PROBES], [(10_000, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(probe, HEIGHT + 1)
    assert [(vin, err.code) for vin, err in e.value.errors] == [(i, want) for i in range(len(PROBES))]
    # One output at a time too: the first of page 0 and the last of the last page.
    for v in (0, N_OUTPUTS - 1):
        with pytest.raises(SpendRejected) as e:
            store.spend(build_tx([spend_input(case.tx, v)], [(9_000, script())]), HEIGHT + 1)
        assert e.value.first.code == want
    status = SpendStatus.NOT_FOUND if point in NO_MASTER else SpendStatus.LOCKED
    for v in REAL:
        assert store.get_spend((case.txid, v), uhash(case.tx, v)).status == status
    if point in NO_MASTER:
        with pytest.raises(TxNotFound):
            store.get(case.txid)
    else:
        meta = store.get(case.txid, ["creating", "spent_utxos"])
        assert meta.creating and meta.spent_utxos == 0


def check_complete(case: Case, store: UtxoStore) -> None:
    """(b) complete and wholly spendable, (c) nothing duplicated or lost — then spend it all."""
    tx, txid = case.tx, case.txid
    meta = store.get(txid)
    assert meta.creating is False
    assert (meta.total_extra_recs, meta.total_utxos, meta.spent_utxos) == (PAGES - 1, len(REAL), 0)
    assert meta.external and meta.fee == FEE and meta.size_in_bytes == tx.size
    assert meta.inpoints == tx.inpoints()
    assert meta.tx is not None and meta.tx.txid == txid  # read back from the blob
    for v in REAL:
        assert store.get_spend((txid, v), uhash(tx, v)).status == SpendStatus.OK, v
    assert store.get_spend((txid, CARRIER), b"\x01" * 32).status == SpendStatus.NOT_FOUND

    db = case.db()
    m = db.master
    assert m.creating == 0 and sorted(db.pages) == list(range(1, PAGES))
    assert all(pg.creating == 0 for pg in db.pages.values())
    assert sum(len(db.slots(k)) // SLOT for k in range(PAGES)) == N_OUTPUTS
    for k in range(PAGES):
        assert len(db.slots(k)) % SLOT == 0
        assert db.slots(k) == expected_slots(tx, k), f"page {k}"  # every slot once, unspent
    assert (m.total_utxos, m.spent_utxos) == (len(REAL), 0)
    assert [(pg.total_utxos, pg.spent_utxos) for _k, pg in sorted(db.pages.items())] == [
        (real_in(k), 0) for k in range(1, PAGES)
    ]

    # Spend every output that is a UTXO: two spending transactions, across all three pages.
    groups = [[v for v in REAL if v < 6], [v for v in REAL if v >= 6]]
    spenders = [
        build_tx([spend_input(tx, v) for v in g], [(sum(tx.outputs[v].satoshis for v in g) - 500, script())])
        for g in groups
    ]
    results = store.spend_many(spenders, HEIGHT + 1)
    for res, g, sp in zip(results, groups, spenders):
        assert isinstance(res, list), res
        assert [(s.txid, s.vout, s.spending_txid, s.spending_vin) for s in res] == [
            (txid, v, sp.txid, i) for i, v in enumerate(g)
        ]
    assert store.get(txid, ["spent_utxos"]).spent_utxos == len(REAL)
    again = build_tx([spend_input(tx, N_OUTPUTS - 1)], [(1000, script())])
    with pytest.raises(SpendRejected) as e:
        store.spend(again, HEIGHT + 2)
    assert isinstance(e.value.first, UtxoSpent) and e.value.first.spending_txid == spenders[1].txid

    db = case.db()
    spender_of = {v: (sp.txid, i) for g, sp in zip(groups, spenders) for i, v in enumerate(g)}
    assert len(db.masters) == 1 and sorted(db.pages) == list(range(1, PAGES))
    assert db.master.spent_utxos == len(REAL)  # the master counts the whole transaction's spends
    for k in range(PAGES):
        raw = db.slots(k)
        spent_here = 0
        for i in range(len(raw) // SLOT):
            v = k * BATCH + i
            slot = raw[i * SLOT : (i + 1) * SLOT]
            if v == CARRIER:
                assert slot == b"\x00" * SLOT
                continue
            sp_txid, vin = spender_of[v]
            assert slot == uhash(tx, v) + sp_txid + vin.to_bytes(4, "little"), v
            spent_here += 1
        if k:
            assert db.pages[k].spent_utxos == spent_here == db.pages[k].total_utxos
    for v in REAL:
        info = store.get_spend((txid, v), uhash(tx, v))
        assert (info.status, info.spending_txid) == (SpendStatus.SPENT, spender_of[v][0])


# -- the tests ------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("point", POINTS)
def test_killed_creator_is_completed_by_a_retry(case: Case, point: str) -> None:
    store = case.store
    holder = case.park(point)
    kill(holder)
    check_crash_state(case, point, holder.pid)
    check_unspendable(case, store, point)
    check_crash_state(case, point, holder.pid)  # the refused spends changed nothing

    # Another worker retries the same create. The dead holder's lock (36 s TTL) is taken over at
    # once: its holder is a process of this host that no longer runs.
    started = time.monotonic()
    out = case.worker_create()
    assert time.monotonic() - started < 30
    if point in NO_MASTER:
        assert out == {"ok": True, "creating": False, "pages": PAGES}  # nothing existed: a new create
    else:
        assert (out["ok"], out["code"]) == (False, "TX_EXISTS"), out  # the master existed: completed
        assert "already existed" in out["message"]
    assert case.db().lock_pids == []  # the retry took the dead holder's lock over, then released it
    check_complete(case, store)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("point", POINTS)
def test_killed_creator_is_completed_by_set_mined(case: Case, point: str) -> None:
    store = case.store
    holder = case.park(point)
    kill(holder)
    check_crash_state(case, point, holder.pid)
    check_unspendable(case, store, point)

    (res,) = store.set_mined_multi([case.txid], BLOCK_ID, HEIGHT + 1)
    if point == "after_lock":
        # Nothing to recover from: no record and no blob. Set-mined reports the tx missing and
        # leaves it absent and unspendable (only the dead holder's lock is there).
        assert isinstance(res, TxNotFound) and res.txid == case.txid
        check_crash_state(case, point, holder.pid)
        check_unspendable(case, store, point)
        # A retried create (the dead holder's lock is taken over at once) makes it.
        meta = store.create(case.tx, HEIGHT)
        assert not meta.creating and meta.total_extra_recs == PAGES - 1
        assert case.db().lock_pids == []
        check_complete(case, store)
        return

    assert res == [BLOCK_ID]
    meta = store.get(case.txid, ["block_ids", "block_heights", "unmined_since", "creating"])
    assert (meta.block_ids, meta.block_heights, meta.unmined_since) == ([BLOCK_ID], [HEIGHT + 1], None)
    assert not meta.creating
    assert json.loads(case.db().master.blocks) == [[BLOCK_ID, HEIGHT + 1, 0]]
    if point in LOCK_HELD:
        # Set-mined recovers without the creation lock, so the dead holder's lock row stays until
        # its TTL lapses or a creator takes it over. It does not matter: the tx is complete, and
        # a later create takes the lock over at once, finds the tx complete and releases it.
        assert case.db().lock_pids == [holder.pid]
        with pytest.raises(TxExists, match="already exists"):
            store.create(case.tx, HEIGHT)
    assert case.db().lock_pids == []
    check_complete(case, store)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("point", POINTS)
def test_stuck_creator_is_taken_over_after_its_lock_lapses(case: Case, point: str) -> None:
    # Both the stuck creator and the taker have 1 s locks.
    store = case.open(FAST_TTL)
    holder = case.park(point, FAST_TTL)  # alive, and never going on
    check_crash_state(case, point, holder.pid)

    if point in LOCK_HELD:
        lock = store.get_creation_lock(case.txid)
        assert lock is not None and lock.process_id == holder.pid
        assert lock.expires_at - lock.created_at == 1000
        # While the lock is live, its holder alive: another create is refused (first thing, well
        # inside the 1 s), and changes nothing.
        with pytest.raises(TxExists, match="being created by another worker"):
            store.create(case.tx, HEIGHT)
        check_crash_state(case, point, holder.pid)
        check_unspendable(case, store, point)
        time.sleep(max(0.0, lock.expires_at / 1000 - time.time()) + 0.05)
        assert store.get_creation_lock(case.txid) is None  # lapsed, though its holder still runs
    else:
        check_unspendable(case, store, point)
        assert store.get_creation_lock(case.txid) is None  # released before phase 2
    check_unspendable(case, store, point)  # a lapsed lock opens nothing: still not spendable
    assert holder.poll() is None

    # Another worker's create now takes over (or, past the lock, just resumes) and completes it.
    if point in NO_MASTER:
        meta = store.create(case.tx, HEIGHT)
        assert not meta.creating and meta.total_extra_recs == PAGES - 1
    else:
        with pytest.raises(TxExists, match="already existed"):
            store.create(case.tx, HEIGHT)
    assert holder.poll() is None  # completed beside the stuck creator, which never moved
    # The taker removed the lapsed lock when it took its own, and released its own.
    assert case.db().lock_pids == []
    kill(holder)
    check_complete(case, store)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("point", POINTS)
def test_killed_creator_is_finished_by_the_recovery_manager_alone(case: Case, point: str) -> None:
    """No retry, no block, no reader: one scan of `utxo recover --once` (a real process on a
    state store of its own) finds the half-done creation once its 1 s lock has lapsed and
    finishes it from the blob — or, killed before the blob was written, clears the lapsed lock
    that is all it left (the tx's own message, retried, makes it then)."""
    store = case.open(FAST_TTL)
    holder = case.park(point, FAST_TTL)
    kill(holder)
    check_crash_state(case, point, holder.pid)
    time.sleep(1.1)  # the lock lapses
    state_url = f"sqlite:///{case.tmp}/state.db"
    open_state_store(state_url).close()
    env = {
        **case._env(), "UTXO_STORE_URL": case.url, "UTXO_BLOB_URL": case.blob_url,
        "UTXO_STATE_URL": state_url,
        "UTXO_BROKER_URL": "memory://", "UTXO_BATCH_SIZE": str(BATCH), "UTXO_RECOVERY_TTL": "0",
        "UTXO_LOCK_BASE_TTL": "1", "UTXO_LOCK_PER_RECORD_TTL": "0", "UTXO_LOCK_MAX_TTL": "1",
    }
    done = subprocess.run([sys.executable, "-m", "workers.cli", "recover", "--once"], env=env, cwd=case.tmp,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ident = f"creation:{case.tx.txid_hex}"
    assert report["creations"] == {"found": 1, "added": 1} and report["claimed"] == [ident]
    (handled,) = report["handled"]
    assert handled["status"] == "done" and handled["released"]
    assert case.db().lock_pids == []
    if point == "after_lock":  # nothing to make it from: only its lapsed lock was left
        assert handled["outcome"].startswith("abandoned")
        assert case.db().masters == [] and not case.blob_exists()
        return
    assert handled["outcome"] == "finished"
    check_complete(case, store)
    again = subprocess.run([sys.executable, "-m", "workers.cli", "recover", "--once"], env=env, cwd=case.tmp,
                           capture_output=True, text=True, timeout=60)
    assert json.loads(again.stdout)["claimed"] == []  # finished for good: nothing found again


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option", ["frozen", "conflicting"])
def test_creation_options_without_a_crash(case: Case, option: str) -> None:
    """The control of the next test: what an uninterrupted create with the option gives."""
    store = case.store
    out = case.worker_create(options={option: True})
    assert out == {"ok": True, "creating": False, "pages": PAGES}
    assert store.set_mined_multi([case.txid], BLOCK_ID, HEIGHT + 1) == [[BLOCK_ID]]
    want = SpendStatus.FROZEN if option == "frozen" else SpendStatus.CONFLICTING
    assert [store.get_spend((case.txid, v), uhash(case.tx, v)).status for v in (0, N_OUTPUTS - 1)] == [
        want,
        want,
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option", ["frozen", "conflicting"])
def test_recovery_from_the_blob_alone_keeps_the_creation_options(case: Case, option: str) -> None:
    store = case.store
    holder = case.park("after_blob", options={option: True})
    kill(holder)
    (res,) = store.set_mined_multi([case.txid], BLOCK_ID, HEIGHT + 1)
    assert res == [BLOCK_ID] and not store.get(case.txid, ["creating"]).creating  # completed...
    # ...and as the create asked: the outputs frozen (or the tx conflicting), as without a crash.
    want = SpendStatus.FROZEN if option == "frozen" else SpendStatus.CONFLICTING
    assert [store.get_spend((case.txid, v), uhash(case.tx, v)).status for v in (0, N_OUTPUTS - 1)] == [
        want,
        want,
    ]
