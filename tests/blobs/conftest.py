"""Backends under test: a directory per test, and a real S3-compatible server (moto's server
mode, started here on 127.0.0.1 for the session) with a fresh bucket per test."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from stores.blob import BlobStore, open_blob_store

BACKENDS = ["file", "s3"]


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


@pytest.fixture(params=BACKENDS)
def blob_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path}/blobs"
    endpoint: str = request.getfixturevalue("s3_endpoint")
    bucket = f"utxoflow-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/blobs?endpoint_url={endpoint}&region=us-east-1"


@pytest.fixture
def blobs(blob_url: str) -> Iterator[BlobStore]:
    store = open_blob_store(blob_url)
    yield store
    store.close()
