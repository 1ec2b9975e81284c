"""The pruner's runs over a real chain (the sequencer in this process, SQLite or PostgreSQL), with
retention 10: what each run at a height deletes, preserves, keeps and reports, checked against
heights worked out here from the chain (the DAH rule of the data-model seed), never against the
store's own view."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chain import Tx
from stores.blob import blob_key, open_blob_store
from stores.state import open_state_store
from stores.utxo import TxNotFound, UtxoStore, open_utxo_store
from tests.pipeline.chains import Chain, confirmed, confirmed_model, funding, outpoints, seed, spend
from workers.chainstate.sequencer import Sequencer
from workers.demo.demochain import block_hash
from workers.pruning.pruner import Pruner, PrunerConfig

RET = 10


class Rig:
    """A chain from a snapshot (funds of 2 outputs each), its sequencer, and a pruner."""

    def __init__(self, seq: Sequencer, **config: Any) -> None:
        self.seq = seq
        self.utxo: UtxoStore = seq.utxo
        self.funds = funding(6, n_outputs=2)
        self.chain: Chain = seed(self.utxo, self.funds)
        cfg = {"retention": RET, "unmined_tx_retention": RET // 2, "parent_preservation_blocks": 3} | config
        self.pruner = Pruner(self.utxo, seq.state, seq.blobs, PrunerConfig(**cfg),
                             start_known=seq.index.start_known)

    def add(self, *txs: Tx) -> int:
        entry = self.seq.submit(self.chain.add(list(txs)))
        assert entry.height is not None
        return entry.height

    def up_to(self, height: int) -> None:
        while self.chain.height - 1 < height:
            self.add()

    def prune(self, height: int) -> dict[str, Any]:
        r = self.pruner.request(height)
        assert r.start  # no runner is live: the caller must start one
        (job,) = self.pruner.drive()
        assert job.status == "completed", job
        assert job.height == height
        return job.figures

    def exists(self, tx: Tx) -> bool:
        return bool(self.utxo.existing([tx.txid]))

    def model(self) -> set[tuple[bytes, int]]:
        return confirmed_model(self.chain.txs, outpoints(self.funds))


@pytest.fixture
def rig_urls(urls: tuple[str, str], tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    yield urls[0], urls[1], f"file://{tmp_path}/blobs"


def make_rig(urls: tuple[str, str, str], **options: Any) -> Rig:
    store_opts = {k: options.pop(k) for k in ("externalize_all", "batch_size") if k in options}
    utxo = open_utxo_store(urls[0], retention=RET, blob_url=urls[2], **store_opts)
    state = open_state_store(urls[1])
    return Rig(Sequencer(utxo, state, open_blob_store(urls[2])), **options)


@pytest.fixture
def rig(rig_urls: tuple[str, str, str]) -> Iterator[Rig]:
    r = make_rig(rig_urls)
    yield r
    r.utxo.close()
    r.seq.state.close()


def test_each_run_deletes_what_is_due_at_its_height_and_notes_it_on_the_parent(rig: Rig) -> None:
    p1 = spend((rig.funds[0], 0), n_outputs=2)  # keeps an output: never due
    c1 = spend((p1, 0))
    h1 = rig.add(p1, c1)
    d1 = spend((c1, 0))
    h2 = rig.add(d1)  # c1 all spent, mined: due at h2 + RET
    e1 = spend((d1, 0))
    h3 = rig.add(e1)  # d1: due at h3 + RET
    assert (h1, h2, h3) == (1001, 1002, 1003)
    rig.up_to(h3 + RET)

    fig = rig.prune(h2 + RET - 1)
    assert fig["delete"]["deleted"] == 0 and rig.exists(c1) and rig.exists(d1)
    fig = rig.prune(h2 + RET)
    assert fig["delete"]["deleted"] == 1 and not rig.exists(c1) and rig.exists(d1)
    assert rig.utxo.get(p1.txid, ["deleted_children"]).deleted_children == [c1.txid]
    fig = rig.prune(h3 + RET)
    assert fig["delete"]["deleted"] == 1 and not rig.exists(d1)
    assert rig.exists(p1) and rig.exists(e1)
    assert rig.utxo.get(p1.txid, ["deleted_children"]).deleted_children == [c1.txid]
    # d1's parent c1 went first: nothing to note anywhere; the confirmed set is untouched
    assert confirmed(rig.utxo) == rig.model()
    # block bodies at or below the run's height less the retention are gone, the rest stay
    for h, raw in enumerate(rig.chain.blocks, start=1001):
        assert rig.seq.blobs.exists(blob_key(block_hash(raw), "block")) == (h > h3), h
    assert fig["bodies"]["removed"] == 1  # block h3 (h1 and h2 went in the earlier runs)


def test_a_request_at_or_below_a_pruned_height_is_answered_at_once(rig: Rig) -> None:
    rig.up_to(1005)
    rig.prune(1005)
    (done,) = rig.seq.state.prune_jobs(1)
    for h in (1005, 1003, 0):
        r = rig.pruner.request(h)
        assert not r.start and r.job.id == done.id and r.job.status == "completed"
    assert rig.pruner.drive() == []  # nothing waits


def test_unmined_parents_are_preserved_then_released(rig: Rig) -> None:
    q = spend((rig.funds[1], 0))
    hq = rig.add(q)
    m = spend((q, 0))  # in the mempool: q is all spent, so due at hq + RET…
    rig.utxo.create(m, hq)
    rig.utxo.spend(m, hq)
    assert rig.utxo.get(q.txid, ["delete_at_height"]).delete_at_height == hq + RET
    rig.up_to(hq + RET)
    fig = rig.prune(hq + RET)  # …but m is older than the unmined retention (5): q is preserved
    assert fig["preserve"]["old_unmined"] == 1 and fig["preserve"]["parents_preserved"] == 1
    assert fig["delete"]["deleted"] == 0 and rig.exists(q)
    meta = rig.utxo.get(q.txid, ["preserve_until", "delete_at_height"])
    assert (meta.preserve_until, meta.delete_at_height) == (hq + RET + 3, None)
    hm = rig.add(m)  # mined at last: no longer an old unmined tx
    rig.up_to(hq + RET + 3)
    fig = rig.prune(hq + RET + 3)  # the preservation ran out: q may go a retention later
    assert fig["preserve"]["expired_preservations"] == 1 and rig.exists(q)
    assert rig.utxo.get(q.txid, ["delete_at_height"]).delete_at_height == hq + RET + 3 + RET
    rig.up_to(hq + 2 * RET + 3)
    fig = rig.prune(hq + 2 * RET + 3)
    assert fig["delete"]["deleted"] == 1 and not rig.exists(q) and rig.exists(m)
    assert hm < hq + 2 * RET + 3
    assert confirmed(rig.utxo) == rig.model()


@pytest.mark.parametrize("defensive", [True, False])
def test_defensive_mode_keeps_a_parent_until_its_spender_is_mined_and_stable(
    rig_urls: tuple[str, str, str], defensive: bool
) -> None:
    rig = make_rig(rig_urls, defensive=defensive, unmined_tx_retention=100)  # (no preservation here)
    try:
        r = spend((rig.funds[2], 0))
        hr = rig.add(r)
        k = spend((r, 0))  # spends r unmined: r is due at hr + RET
        rig.utxo.create(k, hr)
        rig.utxo.spend(k, hr)
        rig.up_to(hr + RET)
        fig = rig.prune(hr + RET)
        if not defensive:  # the retention alone decides
            assert fig["delete"]["deleted"] == 1 and not rig.exists(r)
            return
        assert fig["delete"]["defensive_kept"] == 1 and rig.exists(r)  # k is unmined
        hk = rig.add(k)
        fig = rig.prune(hk)
        assert fig["delete"]["defensive_kept"] == 1 and rig.exists(r)  # mined, not stable yet
        rig.up_to(hk + RET - 1)
        fig = rig.prune(hk + RET - 1)
        assert fig["delete"]["defensive_kept"] == 1 and rig.exists(r)
        rig.add()
        fig = rig.prune(hk + RET)  # stable: r goes
        assert fig["delete"]["deleted"] == 1 and not rig.exists(r)
        assert confirmed(rig.utxo) == rig.model()
    finally:
        rig.utxo.close()
        rig.seq.state.close()


def test_an_external_tx_goes_with_its_blob_and_a_multi_record_tx_goes_whole(
    rig_urls: tuple[str, str, str]
) -> None:
    rig = make_rig(rig_urls, externalize_all=True, batch_size=4)
    try:
        big = spend((rig.funds[3], 0), n_outputs=10)  # 3 records of 4 outputs
        hb = rig.add(big)
        rig.add(spend(*[(big, v) for v in range(10)]))
        keys = [blob_key(big.txid, kind) for kind in ("tx", "outputs")]
        assert any(rig.utxo.external.blobs.exists(k) for k in keys)  # type: ignore[attr-defined]
        assert pages(rig_urls[0], big.txid) == 2
        rig.up_to(hb + 1 + RET)
        fig = rig.prune(hb + 1 + RET)
        assert fig["delete"]["deleted"] >= 1 and fig["delete"]["blobs_deleted"] == fig["delete"]["deleted"]
        with pytest.raises(TxNotFound):
            rig.utxo.get(big.txid)
        assert not any(rig.utxo.external.blobs.exists(k) for k in keys)  # type: ignore[attr-defined]
        assert pages(rig_urls[0], big.txid) == 0
        assert confirmed(rig.utxo) == rig.model()
    finally:
        rig.utxo.close()
        rig.seq.state.close()


def pages(url: str, txid: bytes) -> int:
    """Child-page rows of `txid`, read straight from the test's own database."""
    if url.startswith("sqlite:"):
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return int(db.execute("SELECT COUNT(*) FROM tx_pages WHERE txid = ?", (txid,)).fetchone()[0])
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT COUNT(*) FROM tx_pages WHERE txid = %s", (txid,)).fetchone()
        assert row is not None
        return int(row[0])


def test_a_run_skips_while_the_tip_is_below_its_height_and_says_why(rig: Rig) -> None:
    rig.up_to(1003)
    rig.pruner.request(1010)
    (job,) = rig.pruner.drive()
    assert job.status == "cancelled" and "mining has not reached height 1010" in (job.error or "")
    assert rig.seq.state.prune_done_height() is None
