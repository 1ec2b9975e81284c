"""Fixtures of the CLI tests: run the real `utxo` script as a subprocess, against a SQLite store
in a temporary directory and against PostgreSQL.

PostgreSQL: one fresh database per test session, `utxoflow_cli_<random>` on
the server of UTXOFLOW_PG_ADMIN (default postgresql://postgres@127.0.0.1:5432/postgres,
trust auth), dropped at the end.
Each store inside it is a schema of its own, chosen through the URL's search_path, so a test
that needs an empty store gets one without creating another database.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chain import parse_header

# The server of tests/stores too (UTXOFLOW_PG_ADMIN names its maintenance database).
PG_ADMIN = os.environ.get("UTXOFLOW_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_SERVER = PG_ADMIN.rsplit("/", 1)[0]
PREVOUTS = "mainnet-413567.prevouts.jsonl"
SNAPSHOT_HEIGHT = 413566


ROOT = Path(__file__).resolve().parents[2]


def utxo_command() -> list[str]:
    """`utxo` as this checkout's code: `python -m workers.cli` with the checkout first on the path
    (see `run_utxo`), so that an installed `utxo` of another checkout can never stand in."""
    return [sys.executable, "-m", "workers.cli"]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


Run = Callable[..., Result]


def run_utxo(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
    """Run `utxo ARGS` with no UTXO_* variables of the caller's environment, plus `env`."""
    full = {k: v for k, v in os.environ.items() if not k.upper().startswith("UTXO_")}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    full.update(env or {})
    p = subprocess.run(
        [*utxo_command(), *args], cwd=cwd, env=full, input=stdin, capture_output=True, text=True,
        timeout=120,
    )
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """`run(*args, env=..., stdin=...)` in a fresh working directory (tmp_path)."""

    def _run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
        return run_utxo(*args, cwd=tmp_path, env=env, stdin=stdin)

    return _run


class PgServer:
    def __init__(self, server: str) -> None:
        self.server = server.rstrip("/")
        self.db = f"utxoflow_cli_{secrets.token_hex(4)}"
        self._schemas = 0
        with psycopg.connect(f"{self.server}/postgres", autocommit=True, connect_timeout=5) as c:
            c.execute(f'CREATE DATABASE "{self.db}"')

    def new_store_url(self) -> str:
        """A URL of an empty store: a new schema of the session's database."""
        self._schemas += 1
        schema = f"store_{self._schemas}"
        with psycopg.connect(f"{self.server}/{self.db}", autocommit=True) as c:
            c.execute(f"CREATE SCHEMA {schema}")
        return f"{self.server}/{self.db}?options=-csearch_path%3D{schema}"

    def drop(self) -> None:
        with psycopg.connect(f"{self.server}/postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    try:
        server = PgServer(PG_SERVER)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL not reachable at {PG_SERVER}: {e} (.ci/run starts it)")
    yield server
    server.drop()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty store of the backend under test."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/store/utxo.db"
    server: PgServer = request.getfixturevalue("pg")
    return server.new_store_url()


@pytest.fixture(scope="session")
def prevouts(data_dir: Path) -> list[dict[str, Any]]:
    with open(data_dir / PREVOUTS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def snapshot(prevouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of a snapshot at 413566: those not created in block 413567 itself."""
    return [e for e in prevouts if e["height"] <= SNAPSHOT_HEIGHT]


@pytest.fixture(scope="session")
def snapshot_block_hash(data_dir: Path) -> str:
    """Hash of block 413566: the parent named in block 413567's header."""
    return parse_header((data_dir / "mainnet-413567.block").read_bytes()).prev_hash_hex


@dataclass
class Imported:
    url: str
    result: Result
    cwd: Path

    def run(self, *args: str) -> Result:
        return run_utxo("--store-url", self.url, *args, cwd=self.cwd)


@pytest.fixture(scope="session")
def imported(
    backend: str, data_dir: Path, snapshot_block_hash: str, tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Imported:
    """A store of the backend holding the real snapshot at 413566 (imported once, then read only)."""
    cwd = tmp_path_factory.mktemp(f"imported-{backend}")
    if backend == "sqlite":
        url = f"sqlite:///{cwd}/utxo.db"
    else:
        url = request.getfixturevalue("pg").new_store_url()
    result = run_utxo(
        "--store-url", url, "import-utxos", str(data_dir / PREVOUTS),
        "--height", str(SNAPSHOT_HEIGHT), "--block-hash", snapshot_block_hash, cwd=cwd,
    )
    assert result.code == 0, result.err
    return Imported(url, result, cwd)
