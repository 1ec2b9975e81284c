"""`utxo flower`: Flower on the app, behind credentials set by configuration, and never open
without them on a non-loopback address. (The page in a headless browser comes with the demo.)"""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from chain import parse_block
from tests.pipeline.chains import Chain, funding, spend
from tests.pipeline.workers import ROOT, Pipeline, pipeline_fixture  # noqa: F401  (the fixture)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, auth: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def test_flower_refuses_a_public_address_without_credentials(pipeline: Pipeline) -> None:
    r = pipeline.utxo("flower", "--address", "0.0.0.0")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "utxo: error: Flower on 0.0.0.0 needs credentials: set UTXO_FLOWER_BASIC_AUTH=user:password"
    ]


def test_flower_shows_the_workers_and_their_tasks_to_those_with_credentials(pipeline: Pipeline) -> None:
    port = free_port()
    env = {**pipeline.env, "UTXO_FLOWER_BASIC_AUTH": "ops:s3cret"}
    flower = subprocess.Popen([sys.executable, "-m", "workers.cli", "flower", "--port", str(port)],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pipeline.start_worker("w1")
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                code, _ = get(f"{base}/api/workers")
                break
            except OSError:
                assert time.monotonic() < deadline and flower.poll() is None, "flower did not start"
                time.sleep(0.2)
        assert code == 401  # no credentials, no API
        c = Chain()
        for _ in range(3):
            c.add()
        bad = c.next_block([spend((funding(1)[0], 0))])  # spends an output no one made
        pipeline.enqueue("block", [*c.blocks, bad])
        said = pipeline.wait(refused=1)["refusals"][0]
        assert said["kind"] == "block" and "missing" in said["reason"], said
        deadline = time.monotonic() + 60
        while True:  # the refused block's task is listed as failed, with its reason
            code, workers = get(f"{base}/api/workers?refresh=1", "ops:s3cret")
            code_t, tasks = get(f"{base}/api/tasks", "ops:s3cret")
            names = {t.get("name") for t in (tasks or {}).values()}
            failed = [t for t in (tasks or {}).values() if t.get("state") == "FAILURE"]
            if code == 200 and any(k.startswith("w1@") for k in workers or {}) and (
                "utxoflow.block.arrived" in names and failed
            ):
                break
            assert time.monotonic() < deadline, (code, workers, code_t, names)
            time.sleep(0.5)
        assert [t["name"] for t in failed] == ["utxoflow.block.arrived"], failed
        assert f"block {parse_block(bad).hash_hex} refused" in failed[0]["exception"], failed
        assert "Traceback" not in pipeline.log("w1")  # (an expected outcome: one line)
        assert get(f"{base}/api/workers", "ops:wrong")[0] == 401
        # the task list stays readable: short ids that say what they are, and a block task's
        # arguments show its height and hash
        hashes = [parse_block(b).hash_hex for b in c.blocks]
        shown = {}
        for task_id, t in tasks.items():
            if t.get("name") == "utxoflow.block.arrived" and t.get("state") == "SUCCESS":
                assert re.fullmatch(r"block-\d+-[0-9a-f]{12}", task_id), task_id
                shown[task_id.split("-")[1]] = t["args"]
        assert shown, tasks
        for height, args in shown.items():
            assert args == f"[{height}, {hashes[int(height) - 1]!r}]", (height, args)
    finally:
        flower.terminate()
        flower.wait(timeout=20)
