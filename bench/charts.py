"""The pictures of the docs, drawn from files kept in the repository, by one command:

    python -m bench.charts [--results docs/bench] [--out docs/pictures]

- `scaleout.png`: tx/s by backend and worker count from `bench.scaleout`'s JSON results (its last
  line, saved as `docs/bench/scaleout-BACKEND.json`: each worker count's best run), with the
  ElectrumX anchor of the same run where the result has one, and each bar's speedup over one
  worker. Run the bench, save its last line there, and run this again.
- `pipeline.svg`: the pipeline's picture, from `pipeline.dot` beside it (Graphviz's `dot` on
  PATH; without it the picture is left as it is, and the report says so).

Prints one JSON object on its last line: what was drawn, and what was not and why.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load(results: Path) -> list[dict[str, Any]]:
    """The `bench.scaleout` results in `results` (scaleout-*.json), by backend name."""
    out = []
    for path in sorted(results.glob("scaleout-*.json")):
        d = json.loads(path.read_text())
        if d.get("bench") == "scaleout" and d.get("by_workers"):
            out.append(d)
    return out


def scaleout_chart(results: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # (no screen: files only)
    import matplotlib.pyplot as plt

    counts = sorted({r["workers"] for d in results for r in d["by_workers"]})
    width = 0.8 / max(len(counts), 1)
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    for k, n in enumerate(counts):
        xs, ys, notes = [], [], []
        for i, d in enumerate(results):
            row = next((r for r in d["by_workers"] if r["workers"] == n), None)
            if row is not None:
                xs.append(i + (k - (len(counts) - 1) / 2) * width)
                ys.append(row["tx_per_s"])
                notes.append(f"{row['speedup']:.2f}×")
        bars = ax.bar(xs, ys, width, label=f"{n} worker{'s' if n > 1 else ''}")
        ax.bar_label(bars, labels=notes, fontsize=8, padding=2)
    for i, d in enumerate(results):
        anchor = d.get("electrumx") or {}
        if "tx_per_s" in anchor:
            ax.hlines(anchor["tx_per_s"], i - 0.45, i + 0.45, colors="black", linestyles="dashed",
                      label="ElectrumX sync, same blocks")
    names = [f"{d['backend']}\n({d['txs']:,} txs, {d['cores']} cores)" for d in results]
    ax.set_xticks(range(len(results)), names)
    ax.set_ylabel("transactions per second")
    ax.set_title("bench.scaleout: the user's path, end to end (best run per worker count)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = out / "scaleout.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def pipeline_picture(out: Path) -> Path | str:
    """pipeline.svg from pipeline.dot, or why not."""
    dot = shutil.which("dot")
    source = out / "pipeline.dot"
    if dot is None:
        return "Graphviz's dot is not on PATH: pipeline.svg left as it is"
    if not source.exists():
        return f"no {source}"
    target = out / "pipeline.svg"
    subprocess.run([dot, "-Tsvg", str(source), "-o", str(target)], check=True, timeout=60)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.charts", description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "docs" / "bench")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "pictures")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    drawn: list[str] = []
    left: dict[str, str] = {}
    results = load(args.results)
    if results:
        drawn.append(str(scaleout_chart(results, args.out)))
    else:
        left["scaleout.png"] = f"no bench.scaleout results in {args.results}"
    made = pipeline_picture(args.out)
    if isinstance(made, Path):
        drawn.append(str(made))
    else:
        left["pipeline.svg"] = made
    print(json.dumps({"bench": "charts", "drawn": drawn, "left": left}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
