"""`python -m bench.query` runs at small sizes and ends its stdout with one JSON object whose
listings agree at both sizes and with a full scan (no timing asserted: that is the bench's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_query_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.query", "--utxos", "6000", "--small", "2000", "--scripts", "5",
         "--per-script", "4", "--queries", "10"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["bench"] == "query" and r["backend"] == "sqlite"
    assert (r["utxos_small"], r["utxos_large"], r["outputs_per_query"]) == (2000, 6000, 4)
    assert r["ms_per_query_small"] > 0 and r["ms_per_query_large"] > 0 and r["ratio"] > 0
