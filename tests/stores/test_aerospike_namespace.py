"""A namespace or set the store cannot use is refused when the store opens, by name (the
invariants of stores/utxo/aerospike/client.py): a namespace the cluster lacks; one, or a set,
that gives records an expiry by default (UTXOs would vanish); one that forbids records with an
expiry, Aerospike's default, which the lock records of two-phase creation need. Needs
AEROSPIKE_HOSTS."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stores.utxo import open_utxo_store
from stores.utxo.aerospike.client import namespace_problem, parse_url
from tests.aerospike_server import HOSTS, NAMESPACE, client, drop_set, needs_aerospike, new_url
from tests.cli.conftest import run_utxo
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (fixture)

pytestmark = needs_aerospike
MISSING = "utxoflow_no_such_namespace"


def answers(command: str) -> dict[str, str]:
    """The test server's own answers to an info command, node by node."""
    return {node: text for node, (_err, text) in client().info_all(command).items()}


def setting(answers: dict[str, str], key: str, value: str, sep: str = ";") -> dict[str, str]:
    """`answers` with `key` set to `value` on every node (there already, or added)."""
    out = {}
    for node, text in answers.items():
        text, n = re.subn(rf"(^|{sep}){re.escape(key)}=[^{sep};\n]*", rf"\g<1>{key}={value}", text)
        out[node] = text if n else f"{text.strip().rstrip(';')}{sep}{key}={value};"
    return out


@pytest.fixture
def url() -> Iterator[str]:
    u = new_url()
    yield u
    drop_set(None, u)


def test_a_namespace_the_cluster_lacks_is_refused_at_open_by_name() -> None:
    with pytest.raises(ValueError, match=f"has no namespace '{MISSING}'"):
        open_utxo_store(f"aerospike://{HOSTS}/{MISSING}?set=t")


def test_the_cli_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    r = run_utxo("tx", "00" * 32, cwd=tmp_path, env={"UTXO_STORE_URL": f"aerospike://{HOSTS}/{MISSING}?set=t"})
    assert r.code == 2, r
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and f"no namespace '{MISSING}'" in lines[0], r.err


def test_a_worker_refuses_to_start_at_once_naming_it(pipeline: Pipeline) -> None:
    """No waiting for UTXO_STORE_WAIT, as for a store not reachable yet: it cannot work."""
    bad = {**pipeline.env, "UTXO_STORE_URL": f"aerospike://{HOSTS}/{MISSING}?set=t", "UTXO_STORE_WAIT": "60"}
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "workers.cli", "worker", "-n", "bad@test"], env=bad,
                       cwd=pipeline.tmp, capture_output=True, text=True, timeout=60)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("utxo: ") and "UTXO_STORE_URL" in last, r.stderr
    assert "cannot work: the Aerospike cluster" in last and f"no namespace '{MISSING}'" in last, r.stderr
    assert time.monotonic() - t < 30


def test_a_set_that_expires_records_by_default_is_refused_and_passes_once_it_does_not(url: str) -> None:
    name = parse_url(url).set
    open_utxo_store(url).close()  # the set as the tests use it: accepted
    config = f"set-config:context=namespace;id={NAMESPACE};set={name};default-ttl="
    assert set(answers(config + "100").values()) == {"ok\n"}
    try:
        refused = rf"set '{name}' gives records an expiry by default .*default-ttl 100"
        with pytest.raises(ValueError, match=refused):
            open_utxo_store(url)
    finally:
        assert set(answers(config + "0").values()) == {"ok\n"}
    open_utxo_store(url).close()


def test_the_namespace_rules_on_the_servers_own_answers() -> None:
    ns, sets = answers(f"namespace/{NAMESPACE}"), answers(f"sets/{NAMESPACE}/never_seen_here")
    assert ns and namespace_problem(NAMESPACE, "s", ns, sets) is None
    forbids = setting(setting(ns, "nsup-period", "0"), "allow-ttl-without-nsup", "false")
    problem = namespace_problem(NAMESPACE, "s", forbids, sets)
    assert problem is not None and "forbids records with an expiry" in problem and "nsup-period" in problem
    allowed = setting(forbids, "allow-ttl-without-nsup", "true")
    assert namespace_problem(NAMESPACE, "s", allowed, sets) is None
    expiring = setting(ns, "default-ttl", "2592000")
    problem = namespace_problem(NAMESPACE, "s", expiring, sets)
    assert problem is not None and "default-ttl 2592000" in problem and "must never expire" in problem
