"""Fixtures every test package shares: where the real mainnet data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("UTXOFLOW_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "mainnet-413567.block").exists():
        pytest.fail(f"real mainnet data not found in {DATA} (set UTXOFLOW_DATA to shared/data)")
    return DATA
