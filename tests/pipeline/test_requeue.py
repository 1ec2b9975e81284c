"""The re-sending scan (workers/recovery/requeue.py) over a real state store with a recording publisher,
and the broker's identity (workers/broker/runs.py) on a private Redis: what is due is sent once, what
is not due is left alone, a failed send is left for the next scan."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from stores.state import StateStore, open_state_store
from tests.pipeline.redis_server import RedisServer
from workers.broker.runs import BrokerRun, BrokerUnreachable
from workers.recovery.requeue import requeue, scan
from workers.runtime.ingest import BLOCK_TASK, TX_TASK
from workers.runtime.registry import Registry

RUN, OLD = "run-now", "run-before"


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateStore]:
    s = open_state_store(f"sqlite:///{tmp_path}/state.db")
    yield s
    s.close()


class Recorder:
    """A publisher that records what it is asked to send; fails from the `fail_at`-th send on."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.sent: list[tuple[str, str, str]] = []
        self.fail_at = fail_at

    def __call__(self, task: str, arg: str, ident: str) -> None:
        if self.fail_at is not None and len(self.sent) >= self.fail_at:
            raise ConnectionError("the broker went away")
        self.sent.append((task, arg, ident))


def add(state: StateStore, ident: str, run: str) -> None:
    kind, _, key = ident.partition(":")
    state.add_pending(ident, kind, key, run)


def test_lost_messages_are_sent_again_once(state: StateStore) -> None:
    add(state, "block:aa", OLD)
    add(state, "tx:bb", OLD)
    add(state, "tx:cc", RUN)  # sent under this run, recently: merely slow
    pub = Recorder()
    report = requeue(state, RUN, 3600, pub)
    assert pub.sent == [(BLOCK_TASK, "aa", "block:aa"), (TX_TASK, "bb", "tx:bb")]
    assert (report.lost, report.stale, report.failed, report.resent) == (2, 0, 0, 2)
    assert report.to_json()["broker_run"] == RUN
    again = Recorder()
    assert requeue(state, RUN, 3600, again).resent == 0 and again.sent == []  # no flood
    assert {e.ident for e in state.pending()} == {"block:aa", "tx:bb", "tx:cc"}  # only tasks remove


def test_lost_txs_are_sent_again_in_batches(state: StateStore) -> None:
    """With a batch publisher, consecutive txs go in one message each `tx_batch` of them, in
    registration order; a block between them goes alone (and ends a batch); a batch whose send
    fails is left, with the rest, for the next scan."""
    idents = [f"tx:{k:04x}" for k in range(7)] + ["block:aa"] + [f"tx:{k:04x}" for k in range(7, 9)]
    for ident in idents:
        add(state, ident, OLD)
    singles, batches = Recorder(), []
    report = requeue(state, RUN, 3600, singles, publish_txs=lambda keys, ids: batches.append(ids), tx_batch=3)
    assert singles.sent == [(BLOCK_TASK, "aa", "block:aa")]
    assert batches == [idents[0:3], idents[3:6], idents[6:7], idents[8:10]]
    assert (report.lost, report.failed) == (10, 0)

    for ident in idents:  # lost again; the second batch's send fails
        add(state, ident, "run-gone")
    sent: list[list[str]] = []

    def flaky(keys: list[str], ids: list[str]) -> None:
        if sent:
            raise ConnectionError("the broker went away")
        sent.append(ids)

    report = requeue(state, RUN, 3600, Recorder(), publish_txs=flaky, tx_batch=3)
    assert sent == [idents[0:3]] and (report.lost, report.failed) == (3, 7)
    assert requeue(state, RUN, 3600, Recorder(), publish_txs=lambda k, i: None, tx_batch=3).lost == 7


def test_messages_pending_too_long_are_sent_again(state: StateStore) -> None:
    add(state, "tx:aa", RUN)
    time.sleep(0.25)
    add(state, "tx:bb", RUN)
    pub = Recorder()
    report = requeue(state, RUN, 0.2, pub)
    assert [s[2] for s in pub.sent] == ["tx:aa"] and (report.lost, report.stale) == (0, 1)


def test_a_broker_without_runs_goes_by_age(state: StateStore) -> None:
    add(state, "tx:aa", "")
    assert requeue(state, None, 3600, Recorder()).resent == 0
    time.sleep(0.15)
    report = requeue(state, None, 0.1, Recorder())
    assert (report.lost, report.stale) == (0, 1)


def test_a_failed_send_is_left_for_the_next_scan(state: StateStore) -> None:
    for n in range(5):
        add(state, f"tx:{n}", OLD)
    pub = Recorder(fail_at=2)
    report = requeue(state, RUN, 3600, pub)
    assert [s[2] for s in pub.sent] == ["tx:0", "tx:1"]
    assert (report.resent, report.failed) == (2, 3)
    nxt = Recorder()
    assert requeue(state, RUN, 3600, nxt).resent == 3  # at once, though claimed under this run
    assert [s[2] for s in nxt.sent] == ["tx:2", "tx:3", "tx:4"]


def test_many_in_batches_each_sent_once_even_when_due_again_at_once(state: StateStore) -> None:
    for n in range(23):
        add(state, f"tx:{n:03}", OLD)
    pub = Recorder()
    report = requeue(state, RUN, 0.000001, pub, batch=5)  # every claim is due again a moment later
    assert sorted(s[2] for s in pub.sent) == [f"tx:{n:03}" for n in range(23)]
    assert report.resent == 23


def test_registry_records_the_broker_run(state: StateStore, tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    run = server.start()
    try:
        reg = Registry(state, BrokerRun(server.url))
        reg.add("block:" + "ab" * 32)
        Registry(state).add("tx:" + "cd" * 32)  # no broker to ask: unknown
        runs = {e.ident: (e.kind, e.key, e.broker_run) for e in state.pending()}
        assert runs == {
            "block:" + "ab" * 32: ("block", "ab" * 32, run), "tx:" + "cd" * 32: ("tx", "cd" * 32, ""),
        }
        with pytest.raises(ValueError):
            reg.add("chunk:1")
        with pytest.raises(ValueError):
            reg.add("block")
        reg.done("block:" + "ab" * 32)
        assert reg.pending() == {"tx:" + "cd" * 32}
    finally:
        server.stop()


def test_broker_run_changes_with_a_restart(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    first = server.start()
    try:
        b = BrokerRun(server.url, max_age_s=60)
        assert b.current() == first == b.known()
        server.kill()
        assert b.current() == first  # cached: stale towards the old run, which is the safe side
        with pytest.raises(BrokerUnreachable):
            b.current(fresh=True)
        assert b.known() == first
        second = server.start()
        assert second != first and b.current(fresh=True) == second
    finally:
        server.stop()
    assert BrokerRun("amqp://guest@127.0.0.1//").current() is None  # no runs: age only


def test_broker_run_unreachable_is_known_as_unknown(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)  # never started: nothing listens on its port
    b = BrokerRun(server.url)
    assert b.known() == ""
    with pytest.raises(BrokerUnreachable):
        b.current()


def test_scan_skips_while_the_broker_cannot_say_its_run(state: StateStore, tmp_path: Path) -> None:
    add(state, "tx:aa", OLD)
    svc = SimpleNamespace(
        state=state, settings=SimpleNamespace(requeue_after=3600.0),
        registry=SimpleNamespace(broker=BrokerRun(RedisServer(tmp_path).url)),
    )
    out = scan(svc)  # type: ignore[arg-type]
    assert "skipped" in out
    (e,) = state.pending()
    assert (e.broker_run, e.sends) == (OLD, 1)  # not claimed
