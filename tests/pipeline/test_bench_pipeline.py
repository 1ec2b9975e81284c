"""`python -m bench.pipeline` runs its real path (utxo enqueue, two workers, utxo wait) and
reports what it promises; its figures are the benchmark's business, not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_pipeline_reports_its_fields() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--blocks", "3", "--txs-per-block", "40",
         "--redis", "redis://127.0.0.1:6379/0"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bench"] == "pipeline" and out["txs"] == 3 * 40 and out["blocks"] == 3
    for field in ("tx_per_s", "store_only_tx_per_s", "limit_tx_per_s", "cpu_s_per_1000_tx"):
        assert out[field] > 0, field
    # every block parsed by some worker, none twice in one process (counted in their logs)
    assert out["parses_per_block"] >= 1 and out["parses_per_block_per_process"] == 1.0
