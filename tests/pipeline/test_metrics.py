"""What an operator sees of a real run (issue 15): two `utxo worker`s (one with two pool
processes) serving their metrics, `utxo metrics` and `utxo status` reading the deployment, and
Flower's own metrics — checked against what the test enqueued and against Redis itself (LLEN),
not against the code that counts. The Grafana dashboard may only ask for series a scrape has."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from chain import parse_block
from tests.conftest import free_port
from tests.pipeline.chains import SNAPSHOT_HEIGHT, funding, spend
from tests.pipeline.workers import ROOT, Pipeline, pipeline_fixture, until  # noqa: F401  (the fixture)

Samples = list[tuple[str, dict[str, str], float]]
DASHBOARD = ROOT / "deploy" / "grafana" / "utxoflow.json"
QUEUES = ("blocks", "txs", "prune", "recovery")


def parse(text: str) -> Samples:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse(r.read().decode())


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (over every worker given)."""
    return sum(v for n, ls, v in samples if n == name and labels.items() <= ls.items())


def utxo_metrics(p: Pipeline) -> Samples:
    r = p.utxo("metrics")
    assert r.returncode == 0, r.stderr
    return parse(r.stdout)


def test_a_two_worker_run_seen_through_metrics_status_and_the_dashboard(pipeline: Pipeline) -> None:
    funds = funding(4, n_outputs=50)
    chain = pipeline.seed(funds)
    outs = [(f, v) for f in funds for v in range(50)]
    per_block = 20
    for b in range(6):
        chain.add([spend(o) for o in outs[b * per_block : (b + 1) * per_block]])
    mempool = [spend(o) for o in outs[150:153]]
    base = SNAPSHOT_HEIGHT

    # Nothing consumes yet: the queue gauges must be what Redis holds, the pending count what
    # was enqueued; `utxo enqueue` indexed the blocks (over the snapshot's block, the tip), so
    # the chain lags by all three.
    pipeline.enqueue("block", chain.blocks[:3])
    m = utxo_metrics(pipeline)
    for q in QUEUES:
        assert total(m, "utxoflow_queue_messages", queue=q) == pipeline.redis.llen(q), q
    assert total(m, "utxoflow_queue_messages", queue="blocks") == 3
    assert total(m, "utxoflow_pending_messages", kind="block") == 3
    assert total(m, "utxoflow_tip_height") == base and total(m, "utxoflow_best_height") == base + 3
    assert total(m, "utxoflow_chain_lag_blocks") == 3
    assert total(m, "utxoflow_workers_alive") == 0
    assert total(m, "utxoflow_up", source="state") == total(m, "utxoflow_up", source="broker") == 1

    ports = [free_port(), free_port()]
    pipeline.start_worker("w1", concurrency=2, env={"UTXO_METRICS_PORT": str(ports[0])})
    pipeline.start_worker("w2", env={"UTXO_METRICS_PORT": str(ports[1])})
    pipeline.wait()

    def workers() -> Samples:
        return [s for p in ports for s in scrape(p)]

    w = workers()
    assert total(w, "utxoflow_blocks_applied_total") == 3
    assert total(w, "utxoflow_txs_applied_total", source="block") == 3 * (per_block + 1)

    # The counters move as more blocks apply.
    pipeline.enqueue("block", chain.blocks[3:])
    pipeline.wait()
    w = workers()
    assert total(w, "utxoflow_blocks_applied_total") == 6
    assert total(w, "utxoflow_txs_applied_total", source="block") == 6 * (per_block + 1)
    assert total(w, "utxoflow_blocks_refused_total") == total(w, "utxoflow_blocks_disconnected_total") == 0
    assert total(w, "utxoflow_store_errors_total") == 0
    assert total(w, "utxoflow_block_apply_seconds_count") == 6
    assert total(w, "utxoflow_block_apply_seconds_sum") > 0
    for phase in ("plan", "check", "create", "reclaim", "spend", "mine", "commit"):  # one per block
        assert total(w, "utxoflow_block_phase_seconds_count", phase=phase) == 6, phase
        assert total(w, "utxoflow_block_phase_seconds_bucket", phase=phase, le="+Inf") == 6, phase

    pipeline.enqueue("tx", [t.raw for t in mempool])
    pipeline.wait()
    pipeline.enqueue("tx", [mempool[0].raw])  # the same tx again: in the store, counted once
    pipeline.wait()
    w = workers()
    assert total(w, "utxoflow_mempool_txs_total", outcome="accepted") == 3
    assert total(w, "utxoflow_mempool_txs_total", outcome="known") == 1
    assert total(w, "utxoflow_txs_applied_total", source="mempool") == 3
    # A child sent before its parent waits for it — counted as waiting, not as a store error —
    # and goes in once the parent has.
    parent = spend(outs[160])
    child = spend((parent, 0))
    pipeline.enqueue("tx", [child.raw])
    until(lambda: total(workers(), "utxoflow_mempool_txs_total", outcome="waiting") >= 1, 30, poll=0.2,
          why="the child to wait for its parent")
    pipeline.enqueue("tx", [parent.raw])
    pipeline.wait()
    w = workers()
    assert total(w, "utxoflow_mempool_txs_total", outcome="accepted") == 5
    assert total(w, "utxoflow_mempool_txs_total", outcome="rejected") == 0
    assert total(w, "utxoflow_store_errors_total") == 0

    # A block invalid on its own (its merkle root), sent past the door's checks: refused when
    # it is indexed, and counted so.
    bad = bytearray(chain.next_block([spend(outs[199])]))
    bad[36] ^= 1  # (the header's merkle root)
    pipeline.submit("block", [bytes(bad)])
    pipeline.wait(refused=1)
    assert total(workers(), "utxoflow_blocks_refused_total") == 1

    tip = pipeline.tip()
    assert tip["height"] == base + 6
    # every applied block requests a pruner run, on the `prune` queue (which `utxo wait` does
    # not wait for): one has finished before its gauges are read
    until(lambda: json.loads(pipeline.utxo("prune", "--jobs").stdout)["done_height"] == base + 6, 30,
          poll=0.2, why="the pruner to catch up with the tip")
    m = utxo_metrics(pipeline)
    assert total(m, "utxoflow_tip_height") == total(m, "utxoflow_best_height") == base + 6
    assert total(m, "utxoflow_chain_lag_blocks") == 0
    assert total(m, "utxoflow_blocks", status="applied") == 7  # the snapshot's block and six
    assert total(m, "utxoflow_blocks", status="invalid") == 1
    assert total(m, "utxoflow_pruner_last_job_height") == base + 6
    assert total(m, "utxoflow_pending_messages") == 0
    assert total(m, "utxoflow_workers_alive") == 2
    for q in ("blocks", "txs"):  # (idle: nothing arrives between the two reads)
        assert total(m, "utxoflow_queue_messages", queue=q) == pipeline.redis.llen(q) == 0

    # `utxo status`: the same deployment, for a script and for a person.
    def status() -> dict[str, Any]:
        r = pipeline.utxo("status", "--json")
        assert r.returncode == 0, r.stderr
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    def six_blocks_shown() -> dict[str, Any] | None:
        s = status()
        return s if round(s["rates"]["blocks"] * 60) == 6 else None

    # (each process hands its counts on within a second; the second still counting is left out)
    s = until(six_blocks_shown, 10, poll=0.5, why="the last minute's rates to show the six blocks")
    assert s["chain"]["tip"] == {"height": tip["height"], "hash": tip["hash"]}
    assert s["chain"]["lag"] == 0 and s["chain"]["applying"] == []
    assert round(s["rates"]["block_txs"] * 60) == 6 * (per_block + 1)
    assert round(s["rates"]["mempool_txs"] * 60) == 5
    assert {x["node"] for x in s["workers"]} == {"w1@test", "w2@test"}
    assert s["queues"]["blocks"] == 0 and s["pending"] == {} and s["errors"] == {}
    screen = pipeline.utxo("status")
    assert screen.returncode == 0, screen.stderr
    assert f"tip {tip['height']:,}" in screen.stdout and "w1@test" in screen.stdout

    _check_dashboard(pipeline, [*w, *m])


def _check_dashboard(pipeline: Pipeline, ours: Samples) -> None:
    """Every series the dashboard asks for is in a scrape: ours, and Flower's (its /metrics is
    open, like its health check, even with credentials set)."""
    port = free_port()
    env = {**pipeline.env, "UTXO_FLOWER_BASIC_AUTH": "ops:s3cret"}
    flower = subprocess.Popen([sys.executable, "-m", "workers.cli", "flower", "--port", str(port)],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        names = {n for n, _l, _v in ours}

        def flower_names() -> set[str] | None:
            try:
                got = {n for n, _l, _v in scrape(port)}
            except OSError:
                return None
            seen = {"flower_worker_online", "flower_task_runtime_seconds_bucket"} <= got
            return got if seen else None

        names |= until(flower_names, 60, poll=0.5, why="Flower's metrics of the workers")
    finally:
        flower.terminate()
        flower.wait(timeout=20)
    wanted = dashboard_series(DASHBOARD)
    assert {n for n in wanted if n.startswith("utxoflow_")}, "the dashboard shows no utxoflow metric"
    assert {n for n in wanted if n.startswith("flower_")}, "the dashboard shows none of Flower's"
    assert wanted <= names, sorted(wanted - names)


def dashboard_series(path: Path) -> set[str]:
    """The metric names every panel's queries use."""
    dash = json.loads(path.read_text())
    panels = [*dash["panels"], *(q for p in dash["panels"] for q in p.get("panels", []))]  # (rows)
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return {n for e in exprs for n in re.findall(r"\b((?:utxoflow|flower)_[a-z0-9_]+)", e)}


def test_status_and_metrics_with_no_deployment_say_so(tmp_path: Path) -> None:
    """Nothing has run here and no broker answers: one line naming both, exit 2 — from the
    screen, from --json (which still prints what it has), and from `utxo metrics`."""
    env = {
        "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
        "UTXO_STATE_URL": f"sqlite:///{tmp_path}/state.db", "UTXO_STORE_URL": f"sqlite:///{tmp_path}/u.db",
        "UTXO_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "workers.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    for args in (["status"], ["status", "--json"], ["metrics"]):
        r = run(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith("utxo: error: no utxoflow deployment found"), lines
        assert "UTXO_STATE_URL" in lines[0] and "UTXO_BROKER_URL" in lines[0], lines
    snap = json.loads(run("status", "--json").stdout)
    assert set(snap["errors"]) == {"state", "broker"}
    up = parse(run("metrics").stdout)
    assert total(up, "utxoflow_up", source="state") == total(up, "utxoflow_up", source="broker") == 0
    assert not (tmp_path / "state.db").exists()  # reading made nothing


def test_status_watch_refreshes_until_stopped(pipeline: Pipeline) -> None:
    """`--watch` prints a snapshot per refresh (JSON lines with --json) and ends with exit 0 on
    SIGTERM or Ctrl-C."""
    pipeline.open_state().close()  # (an empty state store: the chain has no tip yet)
    for sig in (signal.SIGTERM, signal.SIGINT):
        p = subprocess.Popen([sys.executable, "-m", "workers.cli", "status", "--json", "--watch", "0.5"],
                             env=pipeline.env, cwd=pipeline.tmp, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None
        first = json.loads(p.stdout.readline())
        second = json.loads(p.stdout.readline())
        assert second["at"] > first["at"] and first["errors"] == {}
        assert first["chain"]["tip"] is None and first["queues"]["blocks"] == 0
        p.send_signal(sig)
        _out, err = p.communicate(timeout=20)
        assert p.returncode == 0, (sig, err)


def test_json_logs_of_a_worker(pipeline: Pipeline) -> None:
    """UTXO_LOG_JSON=1: every log line of the worker is one JSON object, and an applied block's
    line names the block, its height, the phase and the duration — as a log shipper wants them."""
    funds = funding(1, n_outputs=10)
    chain = pipeline.seed(funds)
    for v in range(2):
        chain.add([spend((funds[0], v))])
    pipeline.start_worker("w1", env={"UTXO_LOG_JSON": "1"})
    pipeline.enqueue("block", chain.blocks)
    pipeline.wait()
    pipeline.stop()
    lines = pipeline.log("w1").splitlines()
    # Celery prints its banner and "Warm shutdown" itself; everything logged is JSON: no line in
    # the plain format ("[2026-…: INFO/MainProcess] …") is left
    assert not [ln for ln in lines if re.match(r"\[\d{4}-", ln)], lines
    records = [json.loads(ln) for ln in lines if ln.startswith("{")]
    applied = [r for r in records if r["message"].startswith("applied block")]
    assert [(r["height"], r["phase"]) for r in applied] == [(SNAPSHOT_HEIGHT + 1, "applied"),
                                                          (SNAPSHOT_HEIGHT + 2, "applied")]
    assert [r["block"] for r in applied] == [parse_block(b).hash_hex for b in chain.blocks]
    assert all(r["duration_s"] > 0 and r["txs"] == 2 and r["task"] == "utxoflow.block.arrived"
               and r["task_id"] for r in applied)
    assert all(set(r["phases_s"]) == {"plan", "check", "create", "reclaim", "spend", "mine", "commit"}
               for r in applied)
    # a block's time covers every phase, `plan` too (it was left out: 75 % of it on PostgreSQL)
    assert all(r["duration_s"] >= round(sum(r["phases_s"].values()), 4) - 0.0005 for r in applied), applied
    assert any(r["message"].endswith("ready.") for r in records)
