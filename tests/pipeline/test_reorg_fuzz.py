"""The heaviest valid chain wins whatever the order, the branches or the double spends: random
block trees (Hypothesis picks the seed), their blocks arriving in random order, applied by a
sequencer over real stores; the result must be what a fresh store gets from the best chain alone
(`tests.pipeline.trees`' model): the tip, the confirmed set, and every record of the best chain
(mined in its block, not conflicting, its outputs spent by the best chain's spenders)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from stores.blob import open_blob_store
from stores.state import open_state_store
from stores.utxo import open_utxo_store
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.pipeline.conftest import drop_tables
from tests.pipeline.trees import Tree, check_store, make_tree
from workers.chainstate.sequencer import Sequencer

SEEDS = list(range(1, 25))  # the default run's trees; the slow run draws its own
SLOW_EXAMPLES = 300


def run_tree(tree: Tree, utxo_url: str, state_url: str, blobs: str) -> Sequencer:
    utxo = open_utxo_store(utxo_url, blob_url=blobs)
    tree.seed(utxo)
    seq = Sequencer(utxo, open_state_store(state_url), open_blob_store(blobs))
    for raw in tree.arrival:
        seq.submit(raw)
    return seq


BACKENDS = ["sqlite", "postgresql", pytest.param("aerospike", marks=needs_aerospike)]


def run_and_check(seed: int, backend: str, pg: str | None = None, **shape: int) -> None:
    """Grow tree `seed` (of `shape`), apply it in its arrival order over fresh stores (SQLite in
    a temporary directory; the PostgreSQL database `pg`, its tables dropped first; or a fresh
    Aerospike set, the state on SQLite), check it."""
    tree = make_tree(seed, **shape)
    with tempfile.TemporaryDirectory() as d:
        if backend == "postgresql":
            assert pg is not None
            drop_tables(pg)
            urls = (pg, pg)
        elif backend == "aerospike":
            urls = (new_url(), f"sqlite:///{d}/state.db")
        else:
            urls = (f"sqlite:///{d}/utxo.db", f"sqlite:///{d}/state.db")
        seq = run_tree(tree, *urls, f"file://{Path(d)}/blobs")
        try:
            check_store(tree, seq.utxo, seq.state)
        finally:
            seq.utxo.close()
            seq.state.close()
            if backend == "aerospike":
                drop_set(None, urls[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.timeout(600)
def test_random_trees(backend: str, request: pytest.FixtureRequest) -> None:
    """The fixed seed set (Hypothesis' explicit examples only): 2-3 branches of up to 7 blocks."""
    pg = request.getfixturevalue("pg_url") if backend == "postgresql" else None

    @settings(phases=[Phase.explicit], deadline=None, database=None)
    @given(st.integers(min_value=0))
    def prop(seed: int) -> None:
        run_and_check(seed, backend, pg)

    for seed in SEEDS:
        prop = example(seed)(prop)
    prop()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.timeout(3600)
def test_random_larger_trees(backend: str, request: pytest.FixtureRequest) -> None:
    """SLOW_EXAMPLES seeds Hypothesis draws (derandomized: the same ones every run, so a failure
    is reproduced by its seed): 2-4 branches of up to 10 blocks."""
    pg = request.getfixturevalue("pg_url") if backend == "postgresql" else None

    @settings(max_examples=SLOW_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(min_value=0, max_value=2**32))
    def prop(seed: int) -> None:
        run_and_check(seed, backend, pg, n_branches=4, max_len=9)

    prop()
