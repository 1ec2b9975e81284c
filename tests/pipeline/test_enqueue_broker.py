"""`utxo enqueue` and a broker that is not there, or goes away part-way through a file: a clear
line naming UTXO_BROKER_URL and exit 2, nothing registered when nothing could be sent, the
blocks that went in printed, and a second enqueue of the same file completing it (the chain
then applied whole, checked against the model)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline.chains import confirmed_model
from tests.pipeline.redis_server import RedisServer, broker_fixture  # noqa: F401  (the fixture)
from tests.pipeline.test_faults import check_complete, small_chain
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (the fixture)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("broker_url", [
    "redis://127.0.0.1:6379/999",  # a database number the server does not have
    "redis://127.0.0.1:1/0",  # nothing listening
])  # fmt: skip
def test_an_unreachable_broker_is_refused_before_anything_is_registered(
    pipeline: Pipeline, broker_url: str
) -> None:
    chain, _base = small_chain(pipeline, 2)
    pipeline.env["UTXO_BROKER_URL"] = broker_url
    path = pipeline.tmp / "blocks.hex"
    path.write_text("".join(b.hex() + "\n" for b in chain.blocks))
    r = pipeline.utxo("enqueue", "block", path.name, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert "UTXO_BROKER_URL" in lines[-1] and "nothing was enqueued" in lines[-1], r.stderr
    assert pipeline.pending() == set()


@pytest.fixture
def private(tmp_path: Path, broker: RedisServer) -> Iterator[Pipeline]:
    p = Pipeline(tmp_path, broker.url)
    yield p
    p.stop(graceful=False)


@pytest.mark.timeout(180)
def test_a_broker_gone_mid_file_says_how_far_it_got_and_a_second_enqueue_completes_it(
    private: Pipeline, broker: RedisServer
) -> None:
    pipeline = private
    chain, base = small_chain(pipeline, 60)
    path = pipeline.tmp / "blocks.hex"
    path.write_text("".join(b.hex() + "\n" for b in chain.blocks))
    p = subprocess.Popen([sys.executable, "-m", "workers.cli", "enqueue", "block", path.name],
                         env=pipeline.env, cwd=pipeline.tmp, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    first = p.stdout.readline()  # one block went in: the broker goes away meanwhile
    p.send_signal(signal.SIGSTOP)
    broker.kill()
    p.send_signal(signal.SIGCONT)
    rest, err = p.communicate(timeout=60)
    went = [json.loads(line) for line in (first + rest).splitlines()]
    lines = err.strip().splitlines()
    assert p.returncode == 2 and 1 <= len(went) < len(chain.blocks), (p.returncode, went, err)
    assert f"failed after {len(went)} of {len(chain.blocks)} blocks" in lines[-1], err
    assert "UTXO_BROKER_URL" in lines[-1] and "enqueue the same input again" in lines[-1], err

    broker.start()  # a new run: what was sent is gone with the old one
    r = pipeline.utxo("enqueue", "block", path.name, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(chain.blocks)
    pipeline.start_worker("w1")
    check_complete(pipeline, chain, base)
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)
