"""A UTXO_BROKER_URL that cannot work is bad configuration, not a bug: every command that uses the
broker (`enqueue`, `worker`, `beat`, `flower`) exits 2 before starting anything, with one line
naming UTXO_BROKER_URL (its password masked) and what is wrong — never exit 3 or a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from chain import parse_block
from tests.cli.conftest import Result, run_utxo
from tests.conftest import REDIS
from workers.broker.runs import server_problem, url_problem

BAD = {
    "foo://127.0.0.1:6379/0": "unknown scheme 'foo'",
    "redis://u:secret@127.0.0.1:99999/0": "port out of range",
    "redis://127.0.0.1:abc/0": "port could not be cast to integer",
    "redis://127.0.0.1:6379/abc": "the database (after the host) must be a number, got 'abc'",
    "redis:/127.0.0.1:6379/0": "not a URL",
    "127.0.0.1:6379": "not a URL",
    "redis://[::1:6379/0": "invalid IPv6 URL",
    " ": "it is empty",
    "redis://127.0.0.1:6379/0;bar://h:1": "URL 2 of 2: unknown scheme 'bar'",
    "sentinel://h1:26379;sentinel://h2:26379": "a Sentinel broker needs the primary's name",
    "sentinel://h1:26379/0?master_name=m;redis://h2:6379": "every URL of a Sentinel broker must be sentinel://",
}
LOCAL_REDIS = REDIS  # the suite's Redis (.ci/run starts one at 6379; UTXOFLOW_TEST_REDIS)
COMMANDS = [("enqueue", "block", "block.hex"), ("enqueue", "tx", "tx.hex"), ("worker",), ("beat",),
            ("flower",)]


def run_with_broker(tmp_path: Path, data_dir: Path, url: str, command: tuple[str, ...]) -> Result:
    """`utxo COMMAND` with UTXO_BROKER_URL=`url`, fresh stores and a block and a tx to enqueue."""
    raw = (data_dir / "mainnet-277647.block").read_bytes()
    (tmp_path / "block.hex").write_text(raw.hex() + "\n")
    (tmp_path / "tx.hex").write_text(parse_block(raw).txs[1].raw.hex() + "\n")
    env = {
        "UTXO_STORE_URL": f"sqlite:///{tmp_path}/utxo.db",
        "UTXO_STATE_URL": f"sqlite:///{tmp_path}/state.db",
        "UTXO_BLOB_URL": f"file://{tmp_path}/blobs",
        "UTXO_BROKER_URL": url,
        "UTXO_STORE_WAIT": "0",
    }
    return run_utxo(*command, cwd=tmp_path, env=env)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("url", list(BAD))
def test_a_broker_url_that_cannot_work_is_exit_2_naming_it(
    tmp_path: Path, data_dir: Path, url: str, command: tuple[str, ...]
) -> None:
    r = run_with_broker(tmp_path, data_dir, url, command)
    assert r.code == 2 and r.out == "", (r.code, r.out, r.err)
    (line,) = r.err_lines
    assert line.startswith("utxo: error: UTXO_BROKER_URL (") and BAD[url] in line, line
    assert "secret" not in line
    if command[0] == "enqueue":
        assert line.endswith("; nothing was enqueued"), line


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_database_the_redis_refuses_is_exit_2_naming_it(
    tmp_path: Path, data_dir: Path, command: tuple[str, ...]
) -> None:
    """The Redis answers and has no such database (16 by default): Celery would retry for ever."""
    assert server_problem(LOCAL_REDIS + "/0") is None  # (the Redis answers)
    r = run_with_broker(tmp_path, data_dir, LOCAL_REDIS + "/99", command)
    assert r.code == 2 and r.out == "", (r.code, r.out, r.err)
    (line,) = r.err_lines
    assert line.startswith("utxo: error: UTXO_BROKER_URL (") and "out of range" in line, line


def test_a_redis_that_does_not_answer_is_no_problem_yet() -> None:
    """It may be starting: the consumer waits for it (tests/pipeline/test_redis_restart)."""
    assert server_problem("redis://127.0.0.1:1/0") is None


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "redis://", "rediss://u:p@h:6380/1", "REDIS://h/2", "redis+socket:///tmp/r.sock",
    "sentinel://h1:26379/0?master_name=m;sentinel://h2:26379", "amqp://guest@localhost//", "memory://", "sqs://",
])  # fmt: skip
def test_urls_that_may_work_pass(url: str) -> None:
    assert url_problem(url) is None
