"""Backends under test: a directory per test, and a real S3-compatible server (moto's server
mode, started on 127.0.0.1 for the session by tests/conftest.py) with a fresh bucket per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stores.blob import BlobStore, open_blob_store
from tests.conftest import BLOB_BACKENDS, new_blob_url

BACKENDS = BLOB_BACKENDS


@pytest.fixture(params=BACKENDS)
def blob_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return new_blob_url(request, tmp_path)


@pytest.fixture
def blobs(blob_url: str) -> Iterator[BlobStore]:
    store = open_blob_store(blob_url)
    yield store
    store.close()
