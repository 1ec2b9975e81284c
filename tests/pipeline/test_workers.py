"""End to end: real `utxo worker` processes on a real Redis apply enqueued chains; the result
is compared with the independent model of tests/pipeline/chains.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stores.state import open_state_store
from stores.utxo import open_utxo_store
from tests.pipeline.chains import Chain, confirmed_model, spend

ROOT = Path(__file__).resolve().parents[2]


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
        }
        self.workers: list[subprocess.Popen[bytes]] = []

    def utxo(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "workers.cli", *args], env=self.env, cwd=self.tmp,
                              capture_output=True, text=True, timeout=timeout)

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")
        p = subprocess.Popen([sys.executable, "-m", "workers.cli", "worker", "-n", f"{name}@test"],
                             env=self.env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT)
        self.workers.append(p)
        deadline = time.monotonic() + 60
        while b"ready" not in (self.tmp / f"{name}.log").read_bytes():
            assert p.poll() is None, (self.tmp / f"{name}.log").read_text()
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.1)
        return p

    def stop(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.workers:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def confirmed(self) -> set[tuple[bytes, int]]:
        store = open_utxo_store(self.env["UTXO_STORE_URL"], batch_size=50, blob_url=self.env["UTXO_BLOB_URL"])
        try:
            return {(u.txid, u.vout) for u in store.iter_utxos(confirmed=True)}
        finally:
            store.close()


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    db = random.randint(8, 15)
    broker = f"redis://127.0.0.1:6379/{db}"
    redis.Redis.from_url(broker).flushdb()
    p = Pipeline(tmp_path, broker)
    yield p
    p.stop()
    redis.Redis.from_url(broker).flushdb()


@pytest.mark.timeout(240)
def test_two_workers_apply_a_chain_with_a_multi_record_tx(pipeline: Pipeline) -> None:
    c = Chain()
    for _ in range(101):
        c.add()
    big = spend((c.txs[0][0], 0), n_outputs=120)  # three records at 50 outputs each
    c.add([big, spend((big, 0), (big, 119))])  # parent and child in one block
    c.add([spend((big, 60))])
    (pipeline.tmp / "chain.hex").write_text("\n".join(b.hex() for b in c.blocks) + "\n")
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    r = pipeline.utxo("enqueue", "block", "chain.hex")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(c.blocks)
    r = pipeline.utxo("wait", "--timeout", "180", timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    tip = pipeline.utxo("tip")
    assert tip.returncode == 0 and f'"height": {len(c.blocks)}' in tip.stdout, tip.stdout
    assert pipeline.confirmed() == confirmed_model(c.txs)
    state = open_state_store(pipeline.env["UTXO_STATE_URL"])
    try:
        assert state.counts() == {"applied": len(c.blocks)}
    finally:
        state.close()
    logs = (pipeline.tmp / "w1.log").read_text() + (pipeline.tmp / "w2.log").read_text()
    assert "utxoflow.block.arrived" in logs and "Traceback" not in logs


def test_enqueue_refuses_bad_bytes_and_enqueues_nothing(pipeline: Pipeline) -> None:
    c = Chain()
    c.add()
    (pipeline.tmp / "good.hex").write_text(c.blocks[0].hex() + "\n")
    (pipeline.tmp / "bad.hex").write_text(c.blocks[0][:-3].hex() + "\n")
    r = pipeline.utxo("enqueue", "block", "good.hex", "bad.hex")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "bad.hex" in r.stderr
    assert redis.Redis.from_url(pipeline.env["UTXO_BROKER_URL"]).scard("utxoflow:pending") == 0
