"""Real `utxo worker` processes on a real Redis, for the end-to-end pipeline tests: a `Pipeline`
is one deployment (SQLite stores and file blobs in a temporary directory, an empty Redis
database claimed for the test as the broker) that a test starts workers in, enqueues into, and inspects."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from chain import Tx
from stores.state import StateStore, open_state_store
from stores.utxo import UtxoStore, open_utxo_store
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.conftest import REDIS
from tests.pipeline.chains import Chain, seed
from workers.broker.redisurl import connect
from workers.demo.localredis import claim_database
from workers.runtime.registry import Registry

ROOT = Path(__file__).resolve().parents[2]


def faults(
    point: str | None = None, marker: Path | None = None, prune_delay: float = 0, block_delay: float = 0
) -> dict[str, str]:
    """The environment that injects a fault into a process a test starts (tests/faults): park at
    `point` (writing its pid to `marker`), slow a pruning run by `prune_delay` s a unit, or the
    chain by `block_delay` s a block."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "faults")])}
    if point is not None:
        env["UTXOFLOW_TEST_PARK"] = point
        if marker is not None:
            env["UTXOFLOW_TEST_PARK_FILE"] = str(marker)
    if prune_delay:
        env["UTXOFLOW_TEST_PRUNE_UNIT_DELAY"] = str(prune_delay)
    if block_delay:
        env["UTXOFLOW_TEST_BLOCK_DELAY"] = str(block_delay)
    return env


class Pipeline:
    def __init__(self, tmp: Path, broker: str) -> None:
        self.tmp = tmp
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "UTXO_STORE_URL": f"sqlite:///{tmp}/utxo.db",
            "UTXO_STATE_URL": f"sqlite:///{tmp}/state.db",
            "UTXO_BLOB_URL": f"file://{tmp}/blobs",
            "UTXO_BROKER_URL": broker,
            "UTXO_BATCH_SIZE": "50",
            # Small units, so that the phases of every block of 28 txs or more (4 units: see
            # workers.runtime.services.SHARE_FROM_UNITS) are shared between the workers (the chunk
            # board, helper tasks, and multi-record txs' pages as units).
            "UTXO_BLOCK_CHUNK_TXS": "7",
            "UTXO_BLOCK_CHUNK_HELPERS": "2",
        }
        self.workers: list[subprocess.Popen[bytes]] = []
        self.redis = connect(broker)  # (the primary's, on Sentinel)

    def use_postgres(self, url: str) -> None:
        """Keep the UTXO and state stores in the (empty) PostgreSQL database at `url` instead."""
        self.env["UTXO_STORE_URL"] = self.env["UTXO_STATE_URL"] = url

    def use_aerospike(self, url: str) -> None:
        """Keep the UTXO store in the (empty) Aerospike set at `url` instead (the state store
        stays on SQLite)."""
        self.env["UTXO_STORE_URL"] = url

    # -- commands ------------------------------------------------------------------------------
    def utxo(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "workers.cli", *args], env=self.env, cwd=self.tmp,
                              capture_output=True, text=True, timeout=timeout)

    def enqueue(self, kind: str, items: Sequence[bytes]) -> list[dict[str, Any]]:
        """Write `items` (raw blocks or transactions) as a hex file and `utxo enqueue` it; the
        lines it prints."""
        r = self.enqueue_start(kind, items)
        out, err = r.communicate(timeout=120)
        assert r.returncode == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert len(lines) == len(items), out
        return lines

    def enqueue_start(self, kind: str, items: Sequence[bytes]) -> subprocess.Popen[str]:
        """`utxo enqueue` of `items`, started and left running (to act while it enqueues)."""
        path = self.tmp / f"{kind}-{time.monotonic_ns()}.hex"
        path.write_text("".join(i.hex() + "\n" for i in items))
        return subprocess.Popen([sys.executable, "-m", "workers.cli", "enqueue", kind, path.name],
                                env=self.env, cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def submit(self, kind: str, items: Sequence[bytes]) -> list[str]:
        """Send `items` (raw blocks or transactions) as `utxo enqueue` does, but past its checks
        at the door (tests/pipeline/submit.py): what the workers refuse themselves. Their hashes."""
        path = self.tmp / f"{kind}-{time.monotonic_ns()}.hex"
        path.write_text("".join(i.hex() + "\n" for i in items))
        r = subprocess.run([sys.executable, "-m", "tests.pipeline.submit", kind, path.name], env=self.env,
                           cwd=self.tmp, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    def wait(self, timeout: float = 60, refused: int | None = 0) -> dict[str, Any]:
        """`utxo wait`: everything enqueued so far has been processed, `refused` of it refused
        (exit 4 then, else 0; None: either); what it printed."""
        r = self.utxo("wait", "--timeout", str(timeout), timeout=timeout + 30)
        assert r.returncode in ((0, 4) if refused is None else (4,) if refused else (0,)), (
            r.stdout + r.stderr + self.logs()
        )
        out: dict[str, Any] = json.loads(r.stdout)
        assert refused is None or out["refused"] == refused, out
        return out

    def tip(self) -> dict[str, Any]:
        r = self.utxo("tip")
        assert r.returncode == 0, r.stdout + r.stderr
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    def tx(self, txid: str) -> dict[str, Any] | None:
        """`utxo tx TXID` (None: not in the store)."""
        r = self.utxo("tx", txid)
        if r.returncode != 0:
            assert "not in the store" in r.stderr, r.stdout + r.stderr
            return None
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    # -- workers -------------------------------------------------------------------------------
    def log_path(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def log(self, name: str) -> str:
        return self.log_path(name).read_text(errors="replace")

    def logs(self) -> str:
        return "".join(f"\n--- {p.stem} ---\n{p.read_text(errors='replace')}" for p in self.tmp.glob("*.log"))

    def start_worker(self, name: str, concurrency: int = 1, env: dict[str, str] | None = None
                     ) -> subprocess.Popen[bytes]:
        """A `utxo worker` (`concurrency` pool children; `env` on top of the pipeline's) in a
        process group of its own (so that a test can kill it whole)."""
        return self._start(name, ["worker", "-n", f"{name}@test", "-c", str(concurrency)], b"ready", "worker",
                           env)

    def start_beat(self, name: str = "beat") -> subprocess.Popen[bytes]:
        """`utxo beat`, in a process group of its own, kept with the workers (`stop` stops it
        too); returns once it has started."""
        return self._start(name, ["beat"], b"beat: Starting", "beat")

    def _start(self, name: str, args: list[str], ready: bytes, what: str, env: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        """`utxo ARGS…` logging to NAME.log, kept with the workers; returns once the log shows
        `ready` (fails if the process ends first or takes over a minute)."""
        log = open(self.log_path(name), "ab")
        start = self.log_path(name).stat().st_size
        p = subprocess.Popen([sys.executable, "-m", "workers.cli", *args], env={**self.env, **(env or {})},
                             cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.workers.append(p)
        deadline = time.monotonic() + 60
        while ready not in self.log_path(name).read_bytes()[start:]:
            assert p.poll() is None, self.log(name)
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.1)
        return p

    def stop(self, graceful: bool = True) -> None:
        """Stop every started worker: a warm shutdown (SIGTERM; killed after 20 s), or at once
        (SIGKILL to each worker's process group: its main process and pool child)."""
        for p in self.workers:
            if graceful:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                continue
            try:  # the group too when its main process is gone: a pool child may outlive it
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.workers:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    # -- stores --------------------------------------------------------------------------------
    def open_utxo(self) -> UtxoStore:
        return open_utxo_store(
            self.env["UTXO_STORE_URL"], batch_size=int(self.env["UTXO_BATCH_SIZE"]),
            blob_url=self.env["UTXO_BLOB_URL"],
            externalize_all=self.env.get("UTXO_EXTERNALIZE_ALL") == "true",
        )

    def open_state(self) -> StateStore:
        return open_state_store(self.env["UTXO_STATE_URL"])

    def seed(self, txs: Sequence[Tx]) -> Chain:
        """Seed the (empty) UTXO store with a snapshot holding every output of `txs`; the branch
        that continues it (chains.seed)."""
        store = self.open_utxo()
        try:
            return seed(store, txs)
        finally:
            store.close()

    def confirmed(self) -> set[tuple[bytes, int]]:
        store = self.open_utxo()
        try:
            return {(u.txid, u.vout) for u in store.iter_utxos(confirmed=True)}
        finally:
            store.close()

    def pending(self) -> set[str]:
        """The ids of the registry of pending messages (workers/runtime/registry.py)."""
        state = self.open_state()
        try:
            return Registry(state).pending()
        finally:
            state.close()

    def register(self, ident: str) -> None:
        """Register `ident` as pending, as `utxo enqueue` does before it sends a message."""
        state = self.open_state()
        try:
            Registry(state).add(ident)
        finally:
            state.close()

    def state_counts(self) -> dict[str, int]:
        state = self.open_state()
        try:
            return state.counts()
        finally:
            state.close()


def children(pid: int) -> list[int]:
    """The pids of a process's children (from /proc/*/stat: no psutil here)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid:  # state, then ppid
            out.append(int(stat.parent.name))
    return out


def until(what: Callable[[], Any], timeout: float, poll: float = 0.02, why: str = "") -> Any:
    """Poll `what` until it returns something true; that value (fails after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        v = what()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting: {why}"
        time.sleep(poll)


@pytest.fixture(
    name="any_pipeline", params=["sqlite", "postgresql", pytest.param("aerospike", marks=needs_aerospike)]
)
def any_pipeline_fixture(request: pytest.FixtureRequest, pipeline: Pipeline) -> Iterator[Pipeline]:
    """The pipeline with its UTXO store on SQLite, in a PostgreSQL database of its own (the state
    store too), or in an Aerospike set of its own (AEROSPIKE_HOSTS; skipped without)."""
    if request.param == "postgresql":
        pipeline.use_postgres(request.getfixturevalue("pg_database"))
    if request.param == "aerospike":
        url = new_url()
        pipeline.use_aerospike(url)
        yield pipeline
        pipeline.stop(graceful=False)  # before its set is emptied under it
        drop_set(None, url)
        return
    yield pipeline


@pytest.fixture(name="pipeline")
def pipeline_fixture(tmp_path: Path) -> Iterator[Pipeline]:
    # An empty database of the suite's Redis (UTXOFLOW_TEST_REDIS) claimed for this test, emptied at
    # the end only while the claim is still its own: no one else's data is touched
    # (`workers.demo.localredis`).
    claimed = claim_database(f"{REDIS}/0")
    p = Pipeline(tmp_path, claimed.url)
    try:
        yield p
    finally:
        p.stop(graceful=False)  # what a test checks, it checks before; the stores are thrown away
        claimed.release()
