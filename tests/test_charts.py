"""`python -m bench.charts`: the docs' pictures from the files kept in the repository — the
scale-out chart from `docs/bench`'s results (matplotlib, in the test extra), the pipeline from
its Graphviz source where `dot` is installed — and a report of what it drew and left."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_pictures_are_drawn_from_the_kept_results(tmp_path: Path) -> None:
    shutil.copy(ROOT / "docs" / "pictures" / "pipeline.dot", tmp_path / "pipeline.dot")
    r = subprocess.run([sys.executable, "-m", "bench.charts", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    chart = tmp_path / "scaleout.png"
    assert str(chart) in report["drawn"] and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if shutil.which("dot"):
        assert (tmp_path / "pipeline.svg").read_text().lstrip().startswith("<?xml")
    else:
        assert "dot is not on PATH" in report["left"]["pipeline.svg"]


def test_no_results_is_said_not_failed(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "bench.charts", "--results", str(tmp_path), "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert "no bench.scaleout results" in report["left"]["scaleout.png"]
