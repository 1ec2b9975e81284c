"""ElectrumX's initial sync over the same blocks: the per-core anchor `bench.scaleout` reports
beside the workers (issue 35: "2 workers at least ElectrumX sync's rate on the same file").

ElectrumX is a well-kept, single-process UTXO and history indexer (Python, LevelDB); its initial
sync keeps UTXOs in a memory cache and flushes it in large batches, which is the catch-up shape
this project's batching aims at. It is not a dependency of utxoflow: install it in a venv of its
own (`python -m venv /opt/ex && /opt/ex/bin/pip install 'e-x[leveldb]'`, ElectrumX 2.0.0) and
point `bench.scaleout --electrumx /opt/ex/bin/electrumx_server` (or ELECTRUMX_SERVER) at it.

How it is fed: a small JSON-RPC server in this process plays bitcoind for the generated chain
(getblockcount, getblockhash, getblock hash false, and the few calls ElectrumX makes at start),
serving regtest's genesis block at height 0 and the chain's blocks above it. ElectrumX runs as
`COIN=BitcoinSV NET=regtest` with no listening services and its default cache (1,200 MB), so it
stays in sync mode to the tip. Timed: from its start to its "synced to height N" line, which it
logs after its final flush; CPU: the process's user + system seconds at that moment.

Invariants:
- The daemon serves only what the chain holds; an unknown method is answered with bitcoind's
  "method not found" error, and counted, so a changed ElectrumX shows up as an error, not as a
  silently different run.
- ElectrumX writes only under a temporary directory of this run, removed afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.pipeline import cpu_s
from chain import sha256d

# Regtest's genesis block (Bitcoin Core's chainparams): the header and its one coinbase.
_GENESIS_TX = bytes.fromhex(
    "01000000010000000000000000000000000000000000000000000000000000000000000000ffffffff4d04ffff"
    "001d0104455468652054696d65732030332f4a616e2f32303039204368616e63656c6c6f72206f6e206272696e"
    "6b206f66207365636f6e64206261696c6f757420666f722062616e6b73ffffffff0100f2052a01000000434104"
    "678afdb0fe5548271967f1a67130b7105cd6a828e03909a67962e0ea1f61deb649f6bc3f4cef38c4f35504e51e"
    "c112de5c384df7ba0b8d578a4c702b6bf11d5fac00000000"
)
REGTEST_GENESIS_BLOCK = (
    bytes.fromhex("01000000") + bytes(32) + sha256d(_GENESIS_TX)
    + bytes.fromhex("dae5494d" "ffff7f20" "02000000") + b"\x01" + _GENESIS_TX
)
_SYNCED = re.compile(r"synced to height ([\d,]+)")
SYNC_TIMEOUT_S = 3600


def locate(given: str | None) -> str | None:
    """The electrumx_server to run: the one given, ELECTRUMX_SERVER, or one on PATH."""
    return given or os.environ.get("ELECTRUMX_SERVER") or shutil.which("electrumx_server")


@dataclass
class Daemon:
    """A bitcoind stand-in serving `blocks` (heights 0 …) over JSON-RPC on loopback."""

    blocks: list[bytes]
    unknown: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hashes = [sha256d(b[:80])[::-1].hex() for b in self.blocks]
        self.by_hash = {h: i for i, h in enumerate(self.hashes)}
        daemon = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server calls it by this name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                out = [daemon.call(r) for r in body] if isinstance(body, list) else daemon.call(body)
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass  # quiet: thousands of calls

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://user:pass@127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def call(self, req: dict[str, Any]) -> dict[str, Any]:
        method, params = req.get("method"), req.get("params") or []
        result: Any
        if method == "getblockcount":
            result = len(self.blocks) - 1
        elif method == "getblockhash":
            result = self.hashes[params[0]]
        elif method == "getblock":
            result = self.blocks[self.by_hash[params[0]]].hex()
        elif method == "getnetworkinfo":
            result = {"version": 1_010_000, "subversion": "/utxoflow-bench/", "relayfee": 0.0}
        elif method == "getmempoolinfo":
            result = {"size": 0, "bytes": 0, "mempoolminfee": 0.0}
        elif method == "getrawmempool":
            result = []
        elif method in ("estimatefee", "estimatesmartfee"):
            result = -1
        else:
            self.unknown[str(method)] = self.unknown.get(str(method), 0) + 1
            return {"id": req.get("id"), "result": None,
                    "error": {"code": -32601, "message": f"Method not found: {method}"}}
        return {"id": req.get("id"), "result": result, "error": None}


def sync(server: str, raws: list[bytes], n_txs: int, work: Path) -> dict[str, Any]:
    """ElectrumX's initial sync of `raws` (heights 1 …): its seconds, tx/s and CPU per 1,000
    txs, or {"error": why}."""
    daemon = Daemon([REGTEST_GENESIS_BLOCK, *raws])
    db = Path(tempfile.mkdtemp(prefix="electrumx-", dir=work))
    env = {
        **os.environ, "DB_DIRECTORY": str(db), "DAEMON_URL": daemon.url, "COIN": "BitcoinSV",
        "NET": "regtest", "DB_ENGINE": "leveldb", "SERVICES": "", "PEER_DISCOVERY": "off",
        "PEER_ANNOUNCE": "", "LOG_LEVEL": "info", "ALLOW_ROOT": "1",
    }
    logfile = work / "electrumx.log"
    t0 = time.perf_counter()
    proc = subprocess.Popen([server], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    seconds = cpu = None
    try:
        with open(logfile, "w") as log:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if (m := _SYNCED.search(line)) and int(m.group(1).replace(",", "")) == len(raws):
                    seconds, cpu = time.perf_counter() - t0, cpu_s(proc.pid)
                    break
                if time.perf_counter() - t0 > SYNC_TIMEOUT_S:
                    break
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        daemon.close()
        shutil.rmtree(db, ignore_errors=True)
    if seconds is None or cpu is None:
        tail = logfile.read_text(errors="replace").strip().splitlines()[-3:]
        return {"error": f"ElectrumX did not sync to height {len(raws)}: {' | '.join(tail)}"}
    out: dict[str, Any] = {
        "seconds": round(seconds, 2), "tx_per_s": round(n_txs / seconds),
        "cpu_s_per_1000_tx": round(cpu / (n_txs / 1000), 4),
    }
    if daemon.unknown:
        out["unknown_rpc_calls"] = daemon.unknown
    return out
