"""`python -m bench.pipeline` runs its real path (utxo enqueue, two workers, utxo wait) and
reports what it promises; its figures are the benchmark's business, not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REDIS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_pipeline_reports_its_fields() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--blocks", "3", "--txs-per-block", "40",
         "--redis", f"{REDIS}/0"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bench"] == "pipeline" and out["txs"] == 3 * 40 and out["blocks"] == 3
    for field in ("tx_per_s", "store_only_tx_per_s", "limit_tx_per_s", "cpu_s_per_1000_tx",
                  "sql_floor_tx_per_s", "sql_floor_vs_limit"):
        assert out[field] > 0, field
    # every block parsed by some worker, none twice in one process (counted in their logs)
    assert out["parses_per_block"] >= 1 and out["parses_per_block_per_process"] == 1.0


@pytest.mark.timeout(120)
def test_bench_prune_prunes_every_due_record_and_reports_its_fields() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bench.prune", "--records", "2000", "--per-block", "500"],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # 4 spent blocks of 500 and the 5 seed transactions they spent; the bench itself checks
    # that the job deleted exactly what the plain DELETE did and that nothing due is left
    assert out["bench"] == "prune" and out["records"] == 4 * 500 + 5
    for field in ("records_per_s", "limit_records_per_s", "limit_chunked_records_per_s", "peak_rss_mb",
                  "sql_floor_records_per_s", "sql_floor_ratio"):
        assert out[field] > 0, field


@pytest.mark.timeout(300)
def test_bench_pipeline_prune_compares_pruning_on_and_off() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--prune", "--blocks", "14", "--txs-per-block", "30",
         "--redis", f"{REDIS}/0"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bench"] == "pipeline-prune" and out["txs"] == 14 * 30
    assert out["prune_on_tx_per_s"] > 0 and out["prune_off_tx_per_s"] > 0
    assert isinstance(out["records_pruned_by_wait"], int)  # (how far the runs got is timing)
