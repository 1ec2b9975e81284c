"""`utxo wait` reports its progress on stderr as `utxo enqueue` does (workers/cli/progress.py):
blocks and transactions done and pending, rate, time left — plain log lines when stderr is not a
terminal — while its stdout stays one JSON object. Messages are registered in a real state store
and finished by this test, as workers would."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from stores.state import open_state_store
from tests.cli.conftest import run_utxo, utxo_command
from workers.cli.progress import _so_far
from workers.runtime.registry import Registry

IDENTS = [f"block:{'11' * 32}", f"block:{'22' * 32}", f"tx:{'33' * 32}"]


def registered(tmp_path: Path) -> tuple[str, Registry]:
    url = f"sqlite:///{tmp_path}/state.db"
    reg = Registry(open_state_store(url))
    for ident in IDENTS:
        reg.add(ident)
    return url, reg


def test_a_wait_that_times_out_says_what_it_waited_for(tmp_path: Path) -> None:
    url, reg = registered(tmp_path)
    r = run_utxo("wait", "--timeout", "1", cwd=tmp_path, env={"UTXO_STATE_URL": url})
    assert r.code == 1 and r.json() == {"done": False, "pending": 3, "refused": 0}, r.err
    assert r.err_lines[:2] == [
        "utxo: wait: 0 of 2 blocks done, 2 pending, 0.0 blocks/s, ETA unknown",
        "utxo: wait: 0 of 1 txs done, 1 pending, 0.0 txs/s, ETA unknown",
    ]
    assert [line.split(" in ")[0] for line in r.err_lines[2:]] == [
        "utxo: wait: 0 of 2 blocks", "utxo: wait: 0 of 1 txs"]
    reg.state.close()


def test_a_wait_counts_what_finishes(tmp_path: Path) -> None:
    url, reg = registered(tmp_path)
    env = {"UTXO_STATE_URL": url, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.Popen([*utxo_command(), "wait", "--timeout", "60"], cwd=tmp_path, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None
    first = p.stderr.readline()  # it has read the registry: what it waits for
    assert first.startswith("utxo: wait: 0 of 2 blocks done"), first
    for ident in IDENTS:
        time.sleep(0.2)
        reg.done(ident)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and json.loads(out) == {"done": True, "pending": 0, "refused": 0}, err
    ends = err.splitlines()[-2:]
    assert ends[0].startswith("utxo: wait: 2 blocks in ") and ends[0].endswith(" blocks/s)"), err
    assert ends[1].startswith("utxo: wait: 1 txs in "), err
    reg.state.close()


def test_a_progress_line_says_done_pending_rate_and_time_left() -> None:
    assert _so_far(12, 40, "blocks", 4.0) == "12 of 40 blocks done, 28 pending, 3.0 blocks/s, ETA 9 s"
    assert _so_far(0, 5, "txs", 2.0) == "0 of 5 txs done, 5 pending, 0.0 txs/s, ETA unknown"
