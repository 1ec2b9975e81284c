"""What a `utxo` command loads: on SQLite stores, neither PostgreSQL's driver nor the MuHash
libraries (a tenth of a second or more of every command's start, measured with `-X importtime`);
the commands that need them import them where they are used (tests/cli/test_export.py and the
snapshot tests run those)."""

from __future__ import annotations

from pathlib import Path

from stores.state import open_state_store
from tests.cli.conftest import Run

HEAVY = ("psycopg", "gmpy2", "cryptography", "chain.muhash", "workers.chainstate.commitment")


def imported(err: str) -> set[str]:
    """The modules `python -X importtime` reported loading (its stderr lines)."""
    return {line.rsplit("|", 1)[1].strip() for line in err.splitlines() if line.startswith("import time:")}


def test_a_query_on_sqlite_loads_no_postgresql_driver_and_no_muhash(run: Run, tmp_path: Path) -> None:
    env = {"UTXO_STORE_URL": f"sqlite:///{tmp_path}/utxo.db", "UTXO_STATE_URL": f"sqlite:///{tmp_path}/state.db",
           "PYTHONPROFILEIMPORTTIME": "1"}
    open_state_store(env["UTXO_STATE_URL"]).close()
    r = run("tip", env=env)
    assert r.code == 1 and "no block has been applied yet" in r.err, r.err[-500:]
    mods = imported(r.err)
    assert "workers.cli.app" in mods and "stores.state.sql" in mods  # (the report is read right)
    assert not {m for m in mods if m.split(".")[0] in HEAVY or m in HEAVY}

