"""A private Redis Sentinel deployment for tests of broker failover: a primary, a replica and
three sentinels (quorum 2) on free loopback ports, nothing on disk, as `redis-server` and
`redis-server --sentinel` run them in production (one host here)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import free_port

MASTER = "utxoflow"


class SentinelSet:
    def __init__(self, workdir: Path) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not on PATH")
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = {name: free_port() for name in ("primary", "replica", "s1", "s2", "s3")}
        s1, s2, s3 = (self.ports[s] for s in ("s1", "s2", "s3"))
        self.url = (f"sentinel://127.0.0.1:{s1}/0?master_name={MASTER};sentinel://127.0.0.1:{s2};"
                    f"sentinel://127.0.0.1:{s3}")

    def _run(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        log.close()

    def _server(self, name: str, *extra: str) -> None:
        self._run(name, ["redis-server", "--port", str(self.ports[name]), "--bind", "127.0.0.1",
                         "--save", "", "--appendonly", "no", "--dir", str(self.workdir), *extra])

    def start(self) -> None:
        """Primary, replica (in sync), then the sentinels (each agreeing on the primary)."""
        self._server("primary")
        self._until(lambda: self.client("primary").ping(), "the primary answers")
        self._server("replica", "--replicaof", "127.0.0.1", str(self.ports["primary"]))
        self._until(lambda: self.client("replica").info("replication").get("master_link_status") == "up",
                    "the replica in sync")
        for s in ("s1", "s2", "s3"):
            conf = self.workdir / f"{s}.conf"  # (a sentinel rewrites its own file)
            conf.write_text(
                f"port {self.ports[s]}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.ports['primary']} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            self._run(s, ["redis-server", str(conf), "--sentinel"])
        for s in ("s1", "s2", "s3"):  # each knows the replica and the other sentinels
            self._until(lambda s=s: self._sees(s), f"sentinel {s} sees the replica and its peers")

    def _sees(self, s: str) -> bool:
        m = self.client(s).sentinel_master(MASTER)
        return int(m.get("num-slaves", 0)) >= 1 and int(m.get("num-other-sentinels", 0)) >= 2

    def client(self, name: str) -> redis.Redis:
        port = self.ports[name]
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=1)

    def primary_port(self) -> int:
        """The port the sentinels name as the primary now."""
        _host, port = self.client("s1").sentinel_get_master_addr_by_name(MASTER)
        return int(port)

    def kill_primary(self) -> None:
        """SIGKILL of the primary: what it had not sent to its replica is gone."""
        self.procs["primary"].send_signal(signal.SIGKILL)
        self.procs["primary"].wait(timeout=30)

    def wait_promoted(self, timeout: float = 30) -> None:
        """Until the sentinels name the replica the primary, and it takes writes."""
        self._until(lambda: self.primary_port() == self.ports["replica"]
                    and self.client("replica").info("replication")["role"] == "master",
                    "the replica promoted", timeout)

    def _until(self, ok: object, why: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ok():  # type: ignore[operator]
                    return
            except (redis.RedisError, OSError):
                pass
            dead = [n for n, p in self.procs.items() if p.poll() is not None and n != "primary"]
            assert not dead, f"{dead} exited: " + (self.workdir / f"{dead[0]}.log").read_text()[-2000:]
            assert time.monotonic() < deadline, f"timed out waiting for {why}"
            time.sleep(0.05)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=30)


@pytest.fixture(name="sentinels")
def sentinels_fixture(tmp_path: Path) -> Iterator[SentinelSet]:
    """A private primary, replica and three sentinels (import it to use it)."""
    s = SentinelSet(tmp_path)
    try:
        s.start()
        yield s
    finally:
        s.stop()
