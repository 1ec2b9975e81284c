"""`python -m bench.store` runs at small sizes and ends its stdout with one JSON object; on
Aerospike it also times the store's calls into the client, which can only be a part of the
phases' time (no timing asserted beyond that: the figures are the bench's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.aerospike_server import needs_aerospike

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench.store", "--txs", "600", "--batch", "200", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["bench"] == "store" and out["txs"] == 600 and out["batch"] == 200
    for field in ("create_tx_per_s", "spend_tx_per_s", "mine_tx_per_s", "tx_per_s", "limit_tx_per_s",
                  "ratio"):
        assert out[field] > 0, field
    return out


def test_bench_store_on_sqlite_reports_its_fields() -> None:
    out = bench()
    assert out["backend"] == "sqlite" and "client_floor_ratio" not in out


@needs_aerospike
def test_bench_store_on_aerospike_times_the_client_calls_within_the_phases() -> None:
    out = bench("--backend", "aerospike")
    assert out["backend"] == "aerospike"
    # every phase of every batch (3 of 200 txs) calls the client at least once, and each call
    # went through the clock; the calls are a part of the phases, so their rate can only be higher
    assert out["client_calls"] >= 3 * 3
    assert out["client_floor_tx_per_s"] >= out["tx_per_s"] > 0
    assert out["client_floor_ratio"] >= out["ratio"]
