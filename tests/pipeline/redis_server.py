"""A private `redis-server` for tests that kill and restart the broker (the shared one on 6379
must stay up for everyone else): on a free port, keeping nothing on disk, like the deployment's.
"""

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


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not on PATH")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> str:
        """Start the server on its port (again, after `kill`); its run_id once it answers."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        log = open(self.workdir / f"redis-{self.starts}.log", "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, (self.workdir / f"redis-{self.starts}.log").read_text()
            try:
                return self.run_id()
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def run_id(self) -> str:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        try:
            return str(client.info("server")["run_id"])
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: every queue and message in it is gone (nothing is on disk)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture(name="broker")
def broker_fixture(tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis for a test that kills and restarts it (import it to use it)."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
