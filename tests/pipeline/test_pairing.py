"""The UTXO store and the state store belong together (`workers.chainstate.pairing`): a worker started on a
mistyped UTXO_STORE_URL (or UTXO_STATE_URL) refuses to start, exit 2 naming both URLs, and
takes nothing off the queue; the right worker then applies the chain, no block refused. Every
case of `apart` on real stores, a refusal while the stores are apart (never an invalid block),
and `utxo import-utxos` leaving the chain's tip and commitment readable at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stores.blob import open_blob_store
from stores.errors import StorageError
from stores.state import BlockStatus, StateStore, open_state_store
from stores.utxo import UtxoStore, open_utxo_store
from tests.pipeline.chains import Chain, funding, seed, spend
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (fixture)
from workers.chainstate.pairing import PAIRED, apart
from workers.chainstate.sequencer import Sequencer
from workers.demo.demochain import block_hash


def refused_start(pipeline: Pipeline, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workers.cli", "worker", "-n", "typo@test"],
                          env={**pipeline.env, **env, "UTXO_STORE_WAIT": "5"}, cwd=pipeline.tmp,
                          capture_output=True, text=True, timeout=90)


@pytest.mark.timeout(240)
def test_a_worker_on_a_mistyped_store_url_refuses_to_start_and_the_chain_goes_on(pipeline: Pipeline) -> None:
    c = Chain()
    for _ in range(4):
        c.add()
    pipeline.start_worker("w1")
    pipeline.enqueue("block", c.blocks[:3])
    pipeline.wait(60)
    pipeline.stop()
    pipeline.workers.clear()
    pipeline.enqueue("block", c.blocks[3:])
    queued = pipeline.redis.llen("blocks")
    for setting, typo in [("UTXO_STORE_URL", f"sqlite:///{pipeline.tmp}/utxo-typo.db"),
                          ("UTXO_STATE_URL", f"sqlite:///{pipeline.tmp}/state-typo.db")]:
        r = refused_start(pipeline, **{setting: typo})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and lines, (r.returncode, r.stderr)
        line = lines[-1]
        assert line.startswith("utxo: error: UTXO_STORE_URL (") and "UTXO_STATE_URL (" in line, line
        assert "do not belong together" in line and typo.split("///")[1] in line, line
        assert pipeline.redis.llen("blocks") == queued == 1  # nothing taken
    assert "height 3" in line and "at height 0" not in line  # the typo'd state knows no chain
    pipeline.start_worker("w2")
    pipeline.wait(60)
    assert pipeline.tip()["height"] == 4
    state = pipeline.open_state()
    try:
        entries = [state.get_block(block_hash(b)) for b in c.blocks]
        assert [e.status if e else None for e in entries] == [BlockStatus.APPLIED] * 4
    finally:
        state.close()


Opener = Callable[..., Any]


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Opener]:
    """`stores(name)`: the SQLite UTXO store NAME.db; `stores(name, "state")`: a state store."""
    opened: list[Any] = []

    def make(name: str, kind: str = "utxo") -> Any:
        url = f"sqlite:///{tmp_path}/{name}.db"
        s = open_state_store(url) if kind == "state" else open_utxo_store(url, blob_url=f"file://{tmp_path}/blobs")
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


def apply(utxo: UtxoStore, state: StateStore, tmp_path: Path, blocks: list[bytes]) -> None:
    seq = Sequencer(utxo, state, open_blob_store(f"file://{tmp_path}/blobs"))
    for raw in blocks:
        seq.submit(raw)


def test_apart_on_real_stores(stores: Opener, tmp_path: Path) -> None:
    c = Chain()
    for _ in range(3):
        c.add()
    utxo, state = stores("utxo"), stores("state", "state")
    assert apart(state, utxo, pair=True) is None  # a new deployment: paired
    assert state.get_meta(PAIRED) == utxo.identity() == stores("utxo").identity()  # (reopened: kept)
    apply(utxo, state, tmp_path, c.blocks)
    assert apart(state, utxo) is None
    other = stores("other")  # another store: refused by id, whatever its height
    said = apart(state, other, pair=True)
    assert said is not None and f"lives in UTXO store {utxo.identity()}" in said and "other.db" in said
    assert state.get_meta(PAIRED) == utxo.identity()  # (never re-paired)

    legacy = stores("legacy", "state")  # a state store from before pairing, beside an empty store
    apply(stores("legacy-utxo"), legacy, tmp_path, c.blocks)
    legacy.set_meta(PAIRED, None)
    said = apart(legacy, stores("empty"), pair=True)
    assert said is not None and "at height 3" in said and "at height 0" in said, said
    assert legacy.get_meta(PAIRED) is None
    assert apart(legacy, stores("legacy-utxo"), pair=True) is None  # the right one: paired now
    assert legacy.get_meta(PAIRED) == stores("legacy-utxo").identity()

    fresh = stores("fresh", "state")  # a mistyped state URL beside a store with blocks applied
    said = apart(fresh, utxo, pair=True)
    assert said is not None and "knows no chain" in said and fresh.get_meta(PAIRED) is None


def test_a_store_swapped_under_the_holder_never_makes_a_block_invalid(stores: Opener, tmp_path: Path) -> None:
    """The holder's UTXO store replaced by an empty one while it runs: the next block's inputs
    are missing there, and its refusal is a StorageError instead; the block stays pending and
    the right store applies it."""
    utxo, state = stores("utxo"), stores("state", "state")
    fund = funding(2)
    c = seed(utxo, fund)
    assert apart(state, utxo, pair=True) is None  # (a snapshot's store beside a new state store)
    c.add([spend((fund[0], 0))])
    apply(utxo, state, tmp_path, c.blocks)
    c.add([spend((fund[1], 0))])
    seq = Sequencer(stores("empty"), state, open_blob_store(f"file://{tmp_path}/blobs"))
    with pytest.raises(StorageError, match=r"not applied: .*do not belong together"):
        seq.submit(c.blocks[-1])
    entry = state.get_block(block_hash(c.blocks[-1]))
    assert entry is not None and entry.status is BlockStatus.PENDING, entry
    apply(utxo, state, tmp_path, c.blocks[-1:])  # the right store: applied
    tip = state.tip()
    assert tip is not None and tip.hash == block_hash(c.blocks[-1])


@pytest.mark.timeout(120)
def test_import_utxos_leaves_the_tip_and_commitment_readable_and_pairs(pipeline: Pipeline) -> None:
    c = Chain()
    for _ in range(2):
        c.add()
    pipeline.start_worker("w1")
    pipeline.enqueue("block", c.blocks)
    pipeline.wait(60)
    exported = pipeline.tmp / "snap.jsonl"
    r = pipeline.utxo("export-utxos", str(exported))
    assert r.returncode == 0, r.stderr
    pipeline.stop()
    pipeline.env["UTXO_STORE_URL"] = f"sqlite:///{pipeline.tmp}/utxo2.db"
    pipeline.env["UTXO_STATE_URL"] = f"sqlite:///{pipeline.tmp}/state2.db"
    r = pipeline.utxo("import-utxos", str(exported))
    assert r.returncode == 0, r.stderr
    imported = json.loads(r.stdout)
    tip = pipeline.tip()
    assert tip == {"height": 2, "hash": imported["block_hash"]}
    r = pipeline.utxo("stats", "--hash", "muhash")
    assert r.returncode == 0 and json.loads(r.stdout)["muhash"] == imported["muhash"], r.stderr
    state, utxo = pipeline.open_state(), pipeline.open_utxo()
    try:
        assert state.get_meta(PAIRED) == utxo.identity()
    finally:
        state.close()
        utxo.close()
    # a second import into another new store beside this state store: refused, nothing written
    pipeline.env["UTXO_STORE_URL"] = f"sqlite:///{pipeline.tmp}/utxo3.db"
    t = time.monotonic()
    r = pipeline.utxo("import-utxos", str(exported))
    assert r.returncode == 2 and "do not belong together" in r.stderr, r.stderr
    assert time.monotonic() - t < 60
    store = pipeline.open_utxo()
    try:
        assert store.is_empty()
    finally:
        store.close()
