"""The recovery manager's leadership and leased claims, with real processes: `utxo recover
--run` managers racing (one leads; SIGKILL it and the other leads within a lease), a manager
killed while it holds claims (they come back after the lease, not before), and 1,000 entries
fanned out to three real workers, each handled exactly once — on SQLite and PostgreSQL state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import pytest

from tests.pipeline.workers import Pipeline, faults, pipeline_fixture, until  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(180)
LEASE = 2.0


@pytest.fixture(params=["sqlite", "postgresql"])
def managed(request: pytest.FixtureRequest, pipeline: Pipeline) -> Pipeline:
    if request.param == "postgresql":
        pipeline.use_postgres(request.getfixturevalue("pg_database"))
    pipeline.env.update({
        "UTXO_RECOVERY_LEASE": str(LEASE),
        "UTXO_RECOVERY_SCAN_INTERVAL": "0.2",
        "UTXO_RECOVERY_TTL": "0",
        "UTXO_REQUEUE_AFTER": "1h",
    })
    state = pipeline.open_state()  # made here: a manager opens an existing state store only
    state.close()
    return pipeline


class Manager:
    """A `utxo recover --run` process; its JSON lines (one per scan it led), read as they come."""

    def __init__(self, pipeline: Pipeline, name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "recover", "--run"], env={**pipeline.env, **(env or {})},
            cwd=pipeline.tmp, stdout=subprocess.PIPE, stderr=open(pipeline.log_path(name), "ab"), text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self.first_at: float | None = None
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            if self.first_at is None:
                self.first_at = time.monotonic()
            self.lines.append(json.loads(line))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)


@pytest.fixture
def managers(managed: Pipeline) -> Iterator[list[Manager]]:
    made: list[Manager] = []
    yield made
    for m in made:
        m.kill()


def status(pipeline: Pipeline) -> dict[str, Any]:
    r = pipeline.utxo("recover")
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_one_manager_leads_and_another_takes_over_within_a_lease(
    managed: Pipeline, managers: list[Manager]
) -> None:
    managers += [Manager(managed, "m1"), Manager(managed, "m2")]
    until(lambda: any(m.lines for m in managers), 30, why="a manager leading")
    time.sleep(3 * LEASE)  # long enough for a second leader to show, were there one
    leading = [m for m in managers if m.lines]
    assert len(leading) == 1, [(m.name, len(m.lines)) for m in managers]
    leader, other = leading[0], next(m for m in managers if m is not leading[0])
    me = leader.lines[-1]["leader"]
    assert {line["leader"] for line in leader.lines} == {me}
    assert status(managed)["leader"]["instance"] == me

    leader.kill()
    killed_at = time.time()
    until(lambda: other.lines, 5 * LEASE, why="the other manager leading within a lease")
    # when it took the leadership (its scan's own time aside): within a lease and a tick
    assert other.lines[0]["led_at"] - killed_at <= LEASE + 0.5, (other.lines[0], killed_at)
    assert status(managed)["leader"]["instance"] == other.lines[-1]["leader"] != me
    other.stop()  # a manager that stops lets go: nobody is shown leading
    assert status(managed)["leader"] is None


def test_claims_of_a_killed_manager_come_back_after_the_lease(managed: Pipeline) -> None:
    lease = 10.0  # longer than a second `utxo recover` takes to start and scan, on a slow machine
    managed.env["UTXO_RECOVERY_LEASE"] = str(lease)
    state = managed.open_state()
    keys = [f"{n:064x}" for n in range(1, 4)]
    state.recovery_add("tx", keys)  # no record, no blob: each is "not found" when handled
    state.close()
    parked = managed.tmp / "parked"
    env = {**managed.env, **faults("recovery_handle", parked)}
    first = subprocess.Popen([sys.executable, "-m", "workers.cli", "recover", "--once"], env=env,
                             cwd=managed.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    until(parked.exists, 30, why="the first manager holding its claims")
    first.kill()
    first.wait()
    killed_at = time.monotonic()

    early = json.loads(managed.utxo("recover", "--once").stdout)
    assert time.monotonic() - killed_at < lease, "the check was meant to run inside the lease"
    assert early["claimed"] == []  # the dead manager's leases still run
    while time.monotonic() - killed_at < lease:
        time.sleep(0.1)
    late = json.loads(managed.utxo("recover", "--once").stdout)
    assert sorted(late["claimed"]) == [f"tx:{k}" for k in keys]
    assert all(h["outcome"].startswith("not found") and h["released"] for h in late["handled"])
    state = managed.open_state()
    try:
        for k in keys:
            e = state.recovery_entry(f"tx:{k}")
            assert e is not None and e.attempts == 2 and e.holder == "" and e.status == "pending"
    finally:
        state.close()


ENTRIES = 1000


def test_a_thousand_entries_across_three_workers_are_each_handled_once(managed: Pipeline) -> None:
    """Each entry ends orphan at its first handling (no record, no blob, a grace period already
    over), so a second handling within its lease would show as a second attempt."""
    managed.env.update({"UTXO_RECOVERY_NOT_FOUND_GRACE": "0.001", "UTXO_RECOVERY_BATCH_SIZE": "100",
                        "UTXO_RECOVERY_LEASE": "30"})
    state = managed.open_state()
    keys = [f"{n:064x}" for n in range(1, ENTRIES + 1)]
    state.recovery_add("tx", keys)
    try:
        for name in ("w1", "w2", "w3"):
            args = ["worker", "-n", f"{name}@test", "-Q", "recovery", "-c", "2"]
            managed._start(name, args, b"ready", "worker")

        def orphans() -> bool:
            return state.recovery_summary(0)["states"].get("tx", {}).get("orphan", 0) == ENTRIES

        until(orphans, 120, 0.5, why="every entry handled")
        for k in keys:
            e = state.recovery_entry(f"tx:{k}")
            assert e is not None and e.attempts == 1, e
        summary = state.recovery_summary(0)
        assert summary["states"] == {"tx": {"orphan": ENTRIES}}
        assert summary["outcomes"] == {"tx": {"orphan": ENTRIES}}
    finally:
        state.close()
    logs = {n: managed.log(n) for n in ("w1", "w2", "w3")}
    leaders = [n for n, log in logs.items() if "leads" in log and "no longer leads" not in log]
    assert len(leaders) == 1, logs
    handled_by = [n for n, log in logs.items() if "utxoflow.recovery.handle" in log and "succeeded" in log]
    assert len(handled_by) >= 2, logs  # fanned out, not run by the leader alone
    assert os.environ.get("UTXOFLOW_TEST_PARK") is None
