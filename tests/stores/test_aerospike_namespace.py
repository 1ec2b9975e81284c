"""A namespace the store cannot use is refused when the store opens, by name (the invariants of
stores/utxo/aerospike/client.py): one the cluster lacks, or one that forbids records with an
expiry, which is Aerospike's default and which the lock records of two-phase creation need.
Needs AEROSPIKE_HOSTS."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stores.errors import StorageError
from stores.utxo import open_utxo_store
from stores.utxo.aerospike.client import namespace_problem
from tests.aerospike_server import HOSTS, NAMESPACE, client, needs_aerospike
from tests.cli.conftest import run_utxo

pytestmark = needs_aerospike
MISSING = "utxoflow_no_such_namespace"


def answers() -> dict[str, str]:
    """The test server's own answers to `namespace/NAMESPACE`, node by node."""
    got = client().info_all(f"namespace/{NAMESPACE}")
    return {node: text for node, (err, text) in got.items() if err is None}


def test_a_namespace_the_cluster_lacks_is_refused_at_open_by_name() -> None:
    with pytest.raises(StorageError, match=f"has no namespace '{MISSING}'"):
        open_utxo_store(f"aerospike://{HOSTS}/{MISSING}?set=t")


def test_the_cli_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    r = run_utxo("tx", "00" * 32, cwd=tmp_path, env={"UTXO_STORE_URL": f"aerospike://{HOSTS}/{MISSING}?set=t"})
    assert r.code == 2, r
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and f"no namespace '{MISSING}'" in lines[0], r.err


def test_the_test_namespace_passes_and_one_that_forbids_expiry_is_named() -> None:
    real = answers()
    assert real and namespace_problem(NAMESPACE, real) is None
    no_nsup = {n: re.sub(r"(^|;)nsup-period=\d+", r"\1nsup-period=0", t) for n, t in real.items()}
    assert no_nsup != real
    problem = namespace_problem(NAMESPACE, no_nsup)
    assert problem is not None and "forbids records with an expiry" in problem and "nsup-period" in problem
    allow = ("allow-ttl-without-nsup=false", "allow-ttl-without-nsup=true")
    allowed = {n: t.replace(*allow) for n, t in no_nsup.items()}
    assert allowed != no_nsup and namespace_problem(NAMESPACE, allowed) is None
