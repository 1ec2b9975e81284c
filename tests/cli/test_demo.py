"""`utxo demo` as a user runs it: a real subprocess that starts real workers, Flower and Redis,
applies its generated chain and stops everything it started — when it ends, and when it is
interrupted. Its figures are checked against the generator run again here (it is deterministic),
and its store is read back through the CLI."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from tests.cli.conftest import ROOT, run_utxo, utxo_command
from tests.conftest import REDIS, free_port
from tests.pipeline.chains import commitment_model
from workers.demo.demochain import SNAPSHOT_HEIGHT, generate

SMALL = ["--blocks", "4", "--txs-per-block", "40", "--workers", "2"]
LOCAL_REDIS = REDIS


def demo_env(broker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("UTXO_")}
    env["PYTHONPATH"] = str(ROOT)
    env["UTXO_BROKER_URL"] = broker
    return env


def nowhere() -> str:
    """A broker URL where nothing listens: the demo must start a Redis of its own."""
    return f"redis://127.0.0.1:{free_port()}/0"


def start_demo(cwd: Path, *args: str, broker: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*utxo_command(), "demo", *args], cwd=cwd, env=demo_env(broker), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def survivors(data: Path) -> list[str]:
    """Processes the demo of `data` started that are still alive: each carries the directory
    in its environment (UTXOFLOW_DEMO_DIR) or its command line."""
    mark, found = f"UTXOFLOW_DEMO_DIR={data}".encode(), []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            env, cmd = (p / "environ").read_bytes(), (p / "cmdline").read_bytes()
            stat = (p / "stat").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if b") Z " in stat:
            continue  # a zombie is dead; its parent (not the demo) reaps it
        if mark in env.split(b"\0") or str(data).encode() in cmd:
            found.append(f"{p.name}: " + cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


def no_survivors(data: Path, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while (left := survivors(data)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], left


def gone(broker: str) -> bool:
    """Nothing answers at the private Redis's address any more."""
    try:
        redis.Redis.from_url(broker, socket_connect_timeout=1).ping()
    except redis.ConnectionError:
        return True
    return False


@pytest.mark.timeout(120)
def test_demo_applies_its_chain_with_workers_and_a_private_redis(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    p = start_demo(tmp_path, *SMALL, "--dir", str(data), broker=nowhere())
    out, err = p.communicate(timeout=100)
    assert p.returncode == 0, err
    assert len(out.splitlines()) == 1, out
    s = json.loads(out)
    chain = generate(4, 40, 1000)  # what the demo generated: the generator is deterministic
    assert (s["blocks"], s["txs"]) == (4 + 3, (4 + 3) * 41) == (chain.n_blocks, chain.n_txs)
    assert (s["utxos"], s["satoshis"]) == (len(chain.expected), sum(chain.expected.values()))
    assert s["tip"] == {"height": chain.tip_height, "hash": chain.tip_hash[::-1].hex()}
    assert s["reorgs"] == 1 and s["reorg"]["disconnected"] == 2 and s["reorg"]["connected"] == 3
    assert s["reorg"]["remined_txid"] == chain.remined.txid_hex
    assert s["reorg"]["double_spent_txid"] == chain.double_spent.txid_hex
    assert s["multi_record_tx"] == chain.big.txid_hex
    assert (s["multi_record_outputs"], s["multi_record_records"]) == (2500, 3)
    # the commitment the workers kept, through the reorg: the model's, coin by coin
    assert s["muhash"] == commitment_model(chain.best, SNAPSHOT_HEIGHT + 1, chain.snapshot)[0]
    assert s["tx_per_s"] > 0 and s["workers"] == 2 and s["private_redis"] is True
    assert s["dir"] == str(data) and str(s["flower"]).startswith("http://127.0.0.1:")
    assert "no Redis answers" in err and str(data) in err

    # The store, read back by the CLI: the summary's figures, the tip, and the records
    no_survivors(data)
    assert gone(s["broker"])
    query = ["--store-url", s["store_url"], "--state-url", s["state_url"], "--blob-url", s["blob_url"],
             "--batch-size", "1000"]
    stats = run_utxo(*query, "stats", cwd=tmp_path).json()
    assert (stats["utxos"], stats["satoshis"]) == (s["utxos"], s["satoshis"])
    assert run_utxo(*query, "tip", cwd=tmp_path).json() == s["tip"]
    big = run_utxo(*query, "tx", s["multi_record_tx"], cwd=tmp_path).json()
    assert (big["total_extra_recs"], big["creating"], big["total_utxos"]) == (2, False, 2500)
    with sqlite3.connect(data / "utxo.db") as db:
        pages = db.execute("SELECT page FROM tx_pages WHERE txid = ? ORDER BY page",
                           (chain.big.txid,)).fetchall()
    assert pages == [(1,), (2,)]  # the master record and two more
    loser = run_utxo(*query, "tx", s["reorg"]["double_spent_txid"], cwd=tmp_path).json()
    assert loser["conflicting"] is True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_run_stops_everything_promptly(tmp_path: Path, sig: signal.Signals) -> None:
    data = tmp_path / "demo"
    p = start_demo(tmp_path, "--blocks", "40", "--txs-per-block", "300", "--dir", str(data), broker=nowhere())
    try:
        deadline = time.monotonic() + 90
        # Mid-run: the workers are up and the first blocks are going in (the state store exists).
        while not ((data / "state.db").exists() and len(survivors(data)) >= 4):
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, "the demo did not get going"
            time.sleep(0.05)
        sent = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert out == ""  # no summary: it did not finish
    assert err.splitlines()[-1] == f"utxo: error: interrupted ({sig.name})", err
    assert took < 20, f"took {took:.1f} s to stop"
    no_survivors(data, within=1.0)
    broker = re.search(r"broker: (redis://\S+),", err)
    assert broker is not None and gone(broker[1]), err


def test_a_ctrl_c_swallowed_by_a_finalizer_still_stops_the_demo() -> None:
    """A KeyboardInterrupt raised while a finalizer runs is swallowed by Python ("Exception
    ignored in ... __del__": seen once from redis-py's ConnectionPool in the run above). The
    demo's waits (`pause`) raise again the signal its handler noted. Here the signal lands in a
    `__del__` for certain: the finalizer waits for it."""
    code = """
import gc, os, signal, sys, threading, time
from workers.demo.supervisor import interrupts, pause

class Pool:
    def __del__(self):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(2)  # the signal's KeyboardInterrupt is raised here, and swallowed

with interrupts():
    Pool()
    gc.collect()
    print("after the finalizer", flush=True)
    try:
        pause(5)
    except KeyboardInterrupt as e:
        print("stopped:", e, flush=True)
        sys.exit(130)
print("not stopped", flush=True)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "Exception ignored" in r.stderr and "KeyboardInterrupt" in r.stderr, r.stderr  # (swallowed)
    assert r.stdout.splitlines() == ["after the finalizer", "stopped: SIGINT"], (r.stdout, r.stderr)
    assert r.returncode == 130


@pytest.mark.timeout(120)
def test_demo_on_a_shared_redis_leaves_the_users_data_alone(tmp_path: Path) -> None:
    """With a Redis at UTXO_BROKER_URL, the demo takes an empty database of its own; the user's
    database (here one holding a fake `blocks` queue and registry) is left as it was."""
    token = secrets.token_hex(4)
    users = next(db for db in range(1, 8) if redis.Redis.from_url(f"{LOCAL_REDIS}/{db}").dbsize() == 0)
    r = redis.Redis.from_url(f"{LOCAL_REDIS}/{users}")
    mine = {"blocks": [b"not a message " + token.encode()], "utxoflow:pending": {b"block:" + token.encode()}}
    r.rpush("blocks", *mine["blocks"])
    r.sadd("utxoflow:pending", *mine["utxoflow:pending"])
    r.set(f"user:{token}", "keep")
    try:
        data = tmp_path / "demo"
        p = start_demo(tmp_path, *SMALL, "--dir", str(data), broker=f"{LOCAL_REDIS}/{users}")
        out, err = p.communicate(timeout=100)
        assert p.returncode == 0, err
        s = json.loads(out)
        assert s["private_redis"] is False
        used = int(str(s["broker"]).rsplit("/", 1)[1])
        assert str(s["broker"]).startswith(LOCAL_REDIS) and used != users
        assert r.lrange("blocks", 0, -1) == mine["blocks"]
        assert r.smembers("utxoflow:pending") == mine["utxoflow:pending"]
        assert r.get(f"user:{token}") == b"keep" and r.dbsize() == 3
        assert redis.Redis.from_url(f"{LOCAL_REDIS}/{used}").get("utxoflow:demo:claim") is None
        no_survivors(data)
    finally:
        r.delete("blocks", "utxoflow:pending", f"user:{token}")
