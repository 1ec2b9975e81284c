"""Fixtures every test package shares: the real mainnet data (`tests/data`, checked against its
checksums), and a real S3-compatible server (moto's server mode on 127.0.0.1, one per session)
for blob stores."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import psycopg
import pytest
from moto.server import ThreadedMotoServer

BLOB_BACKENDS = ["file", "s3"]
PG_ADMIN = os.environ.get("UTXOFLOW_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
# the Redis whose databases the tests claim one at a time (workers.demo.localredis.claim_database)
REDIS = os.environ.get("UTXOFLOW_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")

ROOT = Path(__file__).resolve().parent.parent
OWN_DATA = ROOT / "tests" / "data"
DATA = Path(os.environ.get("UTXOFLOW_DATA", OWN_DATA))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data, every file as its checksum says (a changed byte would make a test pass or
    fail for the wrong reason)."""
    for line in (OWN_DATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        path = DATA / name
        if not path.is_file():
            pytest.fail(f"real mainnet data file {name} not found in {DATA} (tests/data, or UTXOFLOW_DATA)")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            pytest.fail(f"{path} does not match its checksum in tests/data/SHA256SUMS")
    return DATA


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def new_blob_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty blob store of the backend `request.param` names ("file" or "s3")."""
    if request.param == "file":
        return f"file://{tmp_path}/blobs"
    endpoint: str = request.getfixturevalue("s3_endpoint")
    bucket = f"utxoflow-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/blobs?endpoint_url={endpoint}&region=us-east-1"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    name = f"utxoflow_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.Error as e:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN}: {e} (.ci/run starts it)")
    admin.execute(f'CREATE DATABASE "{name}"')
    base, _db = PG_ADMIN.rsplit("/", 1)
    yield f"{base}/{name}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()
