"""Scale-out on the user's path: fresh stores, N `utxo worker` processes, `utxo enqueue`, `utxo
wait`, over a chain from regtest's genesis whose spends reach across the whole UTXO set
(`bench.chaingen`), for each N asked; every run's result checked against the chain's model.

    python -m bench.scaleout [--workers 1,2] [--backend sqlite|postgresql|aerospike]
                             [--flow blocks|mempool] [--blocks N] [--txs-per-block N]
                             [--fan-blocks N] [--seed S] [--rounds R] [--redis URL]
                             [--electrumx PATH]

- `--flow blocks` (catch-up): the whole chain in one `utxo enqueue block FILE` (a hex block per
  line), then `utxo wait`. `tx_per_s` counts every transaction, coinbases included.
- `--flow mempool` (Teranode's shape): the setup blocks (coinbases maturing, fan-outs) first,
  untimed; then the main blocks' transactions as `utxo enqueue tx FILE` and `utxo wait` (the tx
  phase, `tx_phase_tx_per_s`; `enqueue_tx_cpu_ms_per_tx`: the enqueue command's own CPU per
  transaction), then the main blocks (`block_phase_tx_per_s`, which then mostly mark
  transactions mined); `tx_per_s` is over both phases.
- Per run: tx/s, the speedup over the first N of the round, the CPU seconds of the worker
  processes (main and pool children) per 1,000 txs, the cores the whole host kept busy (all its
  CPU time over the wall time: workers, Redis, the database server, the CLI), peak worker RSS,
  and the check: the tip (height and hash), the tip's commitment (`utxo stats --hash muhash`)
  and the confirmed set (`utxo utxos --confirmed`, every outpoint and satoshi) equal to the
  model's. A run that fails its check makes the bench exit 1.
- `quarters_tx_per_s`: the main blocks in four quarters, each quarter's transactions over the
  time between the last block applied before it and its own last (from the workers' "applied
  block" log lines); `flatness` is the last quarter's rate over the first's: how the cost per
  transaction holds up as the store grows (`--blocks 156` makes a ~390,000-tx chain).
- `--rounds R` repeats the list of worker counts R times, alternating, so the machine's drift
  spreads over every N; each N's best run is reported beside all runs.
- The anchor (`--flow blocks`): ElectrumX's initial sync of the same blocks (`bench.electrumx`),
  once per round before the round's worker counts, when an `electrumx_server` is found
  (`--electrumx`, ELECTRUMX_SERVER or PATH); each N's row then has `vs_electrumx`, its tx/s over
  the anchor's best. Without one, `electrumx` says why it was left out.
The broker is an empty database of the Redis at `--redis` (default `UTXO_BROKER_URL`), claimed
for the run and emptied only while the claim is still ours. A PostgreSQL run gets a database of
its own (`UTXOFLOW_PG_ADMIN`), dropped afterwards; Aerospike a set of its own (AEROSPIKE_HOSTS),
with the state store on SQLite. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import electrumx
from bench.chaingen import Chain, generate
from bench.pipeline import ROOT, cpu_s, rss_mb, running_workers
from bench.store import database, log
from workers.demo.localredis import claim_database

UTXO = [sys.executable, "-m", "workers.cli"]
STAGE_TIMEOUT_S = 3600


def host_cpu_s() -> float:
    """CPU seconds the whole host has spent (all cores, every state but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def fresh_stores(url: str, tmp: Path, tag: str) -> dict[str, str]:
    blobs = f"file://{tmp}/{tag}-blobs"
    if url.startswith("sqlite"):
        return {"store": f"sqlite:///{tmp}/{tag}-utxo.db", "state": f"sqlite:///{tmp}/{tag}-state.db",
                "blobs": blobs}
    if url.startswith("aerospike"):
        return {"store": url, "state": f"sqlite:///{tmp}/{tag}-state.db", "blobs": blobs}
    return {"store": url, "state": url, "blobs": blobs}


@dataclass
class Run:
    workers: int
    seconds: float
    txs: int
    worker_cpu_s: float
    host_cpu_s: float
    peak_rss_mb: float
    phases: dict[str, float]  # mempool flow: seconds of the tx phase and the block phase
    check: dict[str, Any]
    quarters: list[float]  # tx/s of each quarter of the main blocks (see the module)
    enqueue_cpu_ms_per_tx: float | None = None  # mempool flow: `utxo enqueue tx`'s own CPU

    def row(self) -> dict[str, Any]:
        out = {
            "workers": self.workers,
            "seconds": round(self.seconds, 2),
            "tx_per_s": round(self.txs / self.seconds),
            "cpu_s_per_1000_tx": round(self.worker_cpu_s / (self.txs / 1000), 4),
            "host_cores_busy": round(self.host_cpu_s / self.seconds, 2),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "correct": self.check["ok"],
        }
        if self.quarters:
            out["quarters_tx_per_s"] = [round(q) for q in self.quarters]
            out["flatness"] = round(self.quarters[-1] / self.quarters[0], 3)
        for name, (secs, n) in self.phases_with_counts().items():
            out[f"{name}_tx_per_s"] = round(n / secs)
        if self.enqueue_cpu_ms_per_tx is not None:
            out["enqueue_tx_cpu_ms_per_tx"] = round(self.enqueue_cpu_ms_per_tx, 4)
        if not self.check["ok"]:
            out["check"] = self.check
        return out

    def phases_with_counts(self) -> dict[str, tuple[float, int]]:
        counts = {k: int(v) for k, v in self.phases.items() if k.endswith("_txs")}
        return {k: (v, counts[f"{k}_txs"]) for k, v in self.phases.items() if not k.endswith("_txs")}


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*UTXO, *args], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=STAGE_TIMEOUT_S)
    if r.returncode != 0:
        what, said = " ".join(args[:2]), r.stderr.strip()[-800:]
        raise SystemExit(f"bench: utxo {what} failed ({r.returncode}): {said} (logs in {cwd})")
    return r


def check(chain: Chain, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """The store's tip, commitment and confirmed set against the chain's model."""
    tip = json.loads(_cli(env, cwd, "tip").stdout)
    stats = json.loads(_cli(env, cwd, "stats", "--hash", "muhash").stdout)
    want_hash = chain.tip_hash[::-1].hex()
    listed = subprocess.run([*UTXO, "utxos", "--confirmed"], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=STAGE_TIMEOUT_S)
    got = {}
    for line in listed.stdout.splitlines():
        u = json.loads(line)
        got[(u["txid"], u["vout"])] = u["satoshis"]
    want = {(t[::-1].hex(), v): c[2] for (t, v), c in chain.coins.items()}
    result = {
        "tip": tip["height"] == chain.tip_height and tip["hash"] == want_hash,
        "muhash": stats.get("muhash") == chain.muhash(),
        "confirmed_set": listed.returncode == 0 and got == want,
    }
    result["ok"] = all(result.values())
    if not result["confirmed_set"]:
        result["missing"] = len(want.keys() - got.keys())
        result["extra"] = len(got.keys() - want.keys())
    return result


def _write_lines(path: Path, raws: list[bytes]) -> Path:
    with open(path, "w") as f:
        for raw in raws:
            f.write(raw.hex())
            f.write("\n")
    return path


def run_once(
    chain: Chain, args: argparse.Namespace, n_workers: int, tmp: Path, tag: str, files: dict[str, Path]
) -> Run:
    with database(args.backend) as url:
        urls = fresh_stores(url, tmp, tag)
        claimed = claim_database(args.redis)
        env = {
            **os.environ, "PYTHONPATH": str(ROOT), "UTXO_STORE_URL": urls["store"],
            "UTXO_STATE_URL": urls["state"], "UTXO_BLOB_URL": urls["blobs"], "UTXO_BROKER_URL": claimed.url,
        }
        logs = [tmp / f"{tag}-worker{i}.log" for i in range(n_workers)]
        try:
            with running_workers(env, tmp, logs, "scale", "-c", str(args.concurrency)) as procs:
                phases: dict[str, float] = {}
                if args.flow == "mempool":  # the setup blocks first, untimed
                    _cli(env, tmp, "enqueue", "block", str(files["setup"]))
                    _cli(env, tmp, "wait", "--timeout", str(STAGE_TIMEOUT_S))
                cpu0, host0 = sum(cpu_s(p.pid) for p in procs), host_cpu_s()
                t0 = time.perf_counter()
                enqueue_cpu = None
                if args.flow == "mempool":
                    before = children_cpu_s()
                    _cli(env, tmp, "enqueue", "tx", str(files["txs"]))
                    enqueue_cpu = (children_cpu_s() - before) * 1000 / len(chain.tx_raws)
                    _cli(env, tmp, "wait", "--timeout", str(STAGE_TIMEOUT_S))
                    t1 = time.perf_counter()
                    _cli(env, tmp, "enqueue", "block", str(files["main"]))
                    _cli(env, tmp, "wait", "--timeout", str(STAGE_TIMEOUT_S))
                    txs = chain.n_txs - chain.setup_txs
                    phases = {"tx_phase": t1 - t0, "tx_phase_txs": len(chain.tx_raws),
                              "block_phase": time.perf_counter() - t1, "block_phase_txs": txs}
                else:
                    _cli(env, tmp, "enqueue", "block", str(files["chain"]))
                    _cli(env, tmp, "wait", "--timeout", str(STAGE_TIMEOUT_S))
                    txs = chain.n_txs
                elapsed = time.perf_counter() - t0
                cpu, host = sum(cpu_s(p.pid) for p in procs) - cpu0, host_cpu_s() - host0
                peak = max(rss_mb(p.pid) for p in procs)
                verdict = check(chain, env, tmp)
                quarters = quarter_rates(chain, logs) if args.flow == "blocks" else []
        finally:
            claimed.release()
    return Run(n_workers, elapsed, txs, cpu, host, peak, phases, verdict, quarters, enqueue_cpu)


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended (a `utxo` command once it returned)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


_APPLIED_TEXT = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}):.*applied block [0-9a-f]{64} at height (\d+):"
)


def applied_times(logs: list[Path]) -> dict[int, float]:
    """When each height was applied (the last time, seconds since the epoch), from the workers'
    logs: text lines, or JSON lines (UTXO_LOG_JSON)."""
    out: dict[int, float] = {}
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"phase": "applied"' in line:
                d = json.loads(line)
                out[int(d["height"])] = datetime.fromisoformat(d["ts"]).timestamp()
            elif "applied block" in line and (m := _APPLIED_TEXT.match(line)):
                t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
                out[int(m.group(3))] = t
    return out


def quarter_rates(chain: Chain, logs: list[Path]) -> list[float]:
    """Tx/s of each quarter of the main blocks (see the module); [] when they are too few, or
    an applied line is missing."""
    times = applied_times(logs)
    main = list(range(chain.setup + 1, chain.tip_height + 1))
    if len(main) < 8 or any(h not in times for h in [chain.setup, *main]):
        return []
    per_block = (chain.n_txs - chain.setup_txs) / len(main)
    rates = []
    for q in range(4):
        part = main[q * len(main) // 4 : (q + 1) * len(main) // 4]
        spent = times[part[-1]] - times[part[0] - 1]
        rates.append(len(part) * per_block / max(spent, 1e-3))
    return rates


def anchor_summary(server: str | None, flow: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The anchor's best run and every run, or why there is none."""
    if flow != "blocks":
        return {"skipped": "the anchor syncs blocks: --flow blocks only"}
    if not server:
        return {"skipped": "no electrumx_server (--electrumx, ELECTRUMX_SERVER or PATH); see bench.electrumx"}
    good = [r for r in runs if "tx_per_s" in r]
    if not good:
        return {"error": runs[-1].get("error", "no run") if runs else "no run"}
    return {**max(good, key=lambda r: r["tx_per_s"]), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaleout", description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="1,2", help="worker counts to run, e.g. 1,2,4")
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "aerospike"], default="sqlite")
    ap.add_argument("--flow", choices=["blocks", "mempool"], default="blocks")
    ap.add_argument("--blocks", type=int, default=36, help="main blocks (after 100 + fan-out setup blocks)")
    ap.add_argument("--txs-per-block", type=int, default=2500)
    ap.add_argument("--fan-blocks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=1, help="pool processes per worker (-c)")
    ap.add_argument("--redis", default=os.environ.get("UTXO_BROKER_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--electrumx", help="electrumx_server to run as the anchor (default: "
                    "ELECTRUMX_SERVER, else one on PATH)")
    ap.add_argument("--dir", type=Path, help="work in this directory and keep it (the workers' logs, "
                    "SQLite stores); default: a temporary one, removed")
    args = ap.parse_args(argv)
    try:
        counts = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--workers: not a list of numbers: {args.workers!r}")
    if not counts or min(counts) <= 0 or min(args.blocks, args.txs_per_block, args.rounds) <= 0:
        ap.error("--workers, --blocks, --txs-per-block and --rounds must be positive")
    log(f"generating {args.blocks} main blocks of {args.txs_per_block:,} txs (seed {args.seed}) …")
    chain = generate(args.blocks, args.txs_per_block, args.fan_blocks, args.seed,
                     keep_txs=args.flow == "mempool")
    runs: list[Run] = []
    anchor_runs: list[dict[str, Any]] = []
    server = electrumx.locate(args.electrumx) if args.flow == "blocks" else None
    temporary = tempfile.TemporaryDirectory(prefix="utxoflow-scaleout-")
    workdir = nullcontext(str(args.dir)) if args.dir else temporary
    with workdir as d:
        tmp = Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        files = {"chain": _write_lines(tmp / "chain.hex", chain.raws)}
        if args.flow == "mempool":
            files["setup"] = _write_lines(tmp / "setup.hex", chain.raws[: chain.setup])
            files["main"] = _write_lines(tmp / "main.hex", chain.raws[chain.setup :])
            files["txs"] = _write_lines(tmp / "txs.hex", chain.tx_raws)
        for r in range(args.rounds):
            if server:
                log(f"round {r + 1}: ElectrumX sync of the same blocks …")
                anchor_runs.append(electrumx.sync(server, chain.raws, chain.n_txs, tmp))
                log(f"  {json.dumps(anchor_runs[-1])}")
            for n in counts:
                log(f"round {r + 1}: {n} worker(s), {args.backend}, flow {args.flow} …")
                run = run_once(chain, args, n, tmp, f"r{r}-w{n}", files)
                runs.append(run)
                log(f"  {json.dumps(run.row())}")
    best: dict[int, Run] = {}
    for run in runs:
        if run.workers not in best or run.seconds < best[run.workers].seconds:
            best[run.workers] = run
    base = best[counts[0]]
    anchor = anchor_summary(server, args.flow, anchor_runs)
    rows = []
    for n in counts:
        row = best[n].row()
        row["speedup"] = round(base.seconds / best[n].seconds * best[n].txs / base.txs, 3)
        if "tx_per_s" in anchor:
            row["vs_electrumx"] = round(row["tx_per_s"] / anchor["tx_per_s"], 3)
        rows.append(row)
    result: dict[str, Any] = {
        "bench": "scaleout", "backend": args.backend, "flow": args.flow, "blocks": chain.tip_height,
        "main_blocks": args.blocks, "txs_per_block": args.txs_per_block, "txs": runs[0].txs,
        "utxos": len(chain.coins), "cores": os.cpu_count(), "rounds": args.rounds,
        "correct": all(r.check["ok"] for r in runs), "by_workers": rows,
        "runs": [r.row() for r in runs], "electrumx": anchor,
    }
    print(json.dumps(result))
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
