"""`python -m bench.parse` runs and ends its stdout with one JSON object (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "bench",
    "block",
    "txs",
    "ms_per_block",
    "ms_per_block_min",
    "target_ms",
    "merkle_ok",
    "hashlib_floor_ms",
}


def run_bench(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UTXOFLOW_DATA": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "bench.parse", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bench_parse_prints_json_last(data_dir: Path) -> None:
    p = run_bench(data_dir, "--repeat", "2")
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    r = json.loads(last)
    assert KEYS <= r.keys()
    assert r["bench"] == "parse"
    assert r["block"] == "mainnet-413567.block"
    assert r["txs"] == 1557
    assert r["merkle_ok"] is True
    assert r["target_ms"] == 50
    assert r["repeat"] == 2
    for k in ("ms_per_block", "ms_per_block_min", "hashlib_floor_ms"):
        assert isinstance(r[k], float | int) and r[k] > 0
    assert r["ms_per_block_min"] <= r["ms_per_block"]
    assert "ms" in p.stderr  # the human-readable figures


def test_bench_parse_other_block_and_bad_args(data_dir: Path) -> None:
    p = run_bench(data_dir, "--block", str(data_dir / "mainnet-277647.block"), "--repeat", "1")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["block"] == "mainnet-277647.block" and r["txs"] == 213 and r["merkle_ok"] is True
    p = run_bench(data_dir, "--repeat", "0")
    assert p.returncode == 2 and "--repeat" in p.stderr
    p = run_bench(data_dir, "--block", str(data_dir / "no-such.block"))
    assert p.returncode == 2 and "not found" in p.stderr
