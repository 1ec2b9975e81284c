"""Transactions through the pipeline: `utxo enqueue tx FILE` (hex, one per line, standard or
extended format) to real `utxo worker` processes on a real Redis. A transaction is created
unmined and spends its inputs; one whose parent has not arrived waits for it; a double spend of
a mempool transaction is rejected; a block that mines a mempool transaction makes it mined, one
that double-spends it makes it (and its descendants) conflicting."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from chain import Tx
from tests.pipeline.chains import Chain, confirmed_model, funding, outpoints, spend
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(120)


def seeded(pipeline: Pipeline, n: int = 4) -> tuple[Chain, list[Tx], set[tuple[bytes, int]]]:
    """A store seeded with `n` snapshot transactions of two outputs each, and one worker."""
    funds = funding(n, n_outputs=2)
    chain = pipeline.seed(funds)
    pipeline.start_worker("w1")
    return chain, funds, outpoints(funds)


def tx(pipeline: Pipeline, t: Tx) -> dict[str, Any]:
    """`utxo tx` of a transaction that must be in the store."""
    meta = pipeline.tx(t.txid_hex)
    assert meta is not None, f"tx {t.txid_hex} is not in the store\n{pipeline.logs()}"
    return meta


def unmined(pipeline: Pipeline, t: Tx) -> None:
    meta = tx(pipeline, t)
    assert meta["unmined_since"] is not None and meta["block_ids"] == [], meta
    assert not meta["conflicting"] and not meta["creating"], meta
    assert meta["hex"] == t.raw.hex()  # kept in the standard form, whichever form came in


def spent_by(pipeline: Pipeline, parent: Tx, vout: int) -> str | None:
    """The txid (display hex) spending an output, per `utxo outpoint` (None: unspent)."""
    r = pipeline.utxo("outpoint", f"{parent.txid_hex}:{vout}")
    assert r.returncode == 0, r.stdout + r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out.get("spending_txid")


def unconfirmed(pipeline: Pipeline) -> set[tuple[bytes, int]]:
    """Every unspent output of a non-conflicting record, mined or not (`utxo utxos`)."""
    store = pipeline.open_utxo()
    try:
        return {(u.txid, u.vout) for u in store.iter_utxos(confirmed=False)}
    finally:
        store.close()


def test_a_tx_whose_parents_are_mined_is_accepted_unmined(pipeline: Pipeline) -> None:
    chain, funds, base = seeded(pipeline)
    a = spend((funds[0], 0), n_outputs=2)
    chain.add([a])
    pipeline.enqueue("block", chain.blocks)
    pipeline.wait()
    b = spend((a, 0), (funds[1], 0))  # parents mined in a block and in the snapshot
    c = spend((funds[2], 1), n_outputs=3)
    assert b.is_extended and c.is_extended
    path = pipeline.tmp / "txs.hex"  # one standard line, one extended (BIP-239)
    path.write_text(f"{b.raw.hex()}\n{c.serialize(extended=True).hex()}\n")
    r = pipeline.utxo("enqueue", "tx", path.name)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["txid"] for line in r.stdout.splitlines()] == [b.txid_hex, c.txid_hex]
    pipeline.wait()

    unmined(pipeline, b)
    unmined(pipeline, c)
    assert tx(pipeline, b)["unmined_since"] == pipeline.tip()["height"] == 1001
    assert spent_by(pipeline, a, 0) == spent_by(pipeline, funds[1], 0) == b.txid_hex
    assert spent_by(pipeline, funds[2], 1) == c.txid_hex
    assert spent_by(pipeline, a, 1) is None
    # the confirmed set is the blocks' alone; the unconfirmed view has the mempool's spends
    model = confirmed_model(chain.txs, base)
    assert pipeline.confirmed() == model
    assert unconfirmed(pipeline) == (model - {(a.txid, 0), (funds[1].txid, 0), (funds[2].txid, 1)}) | {
        (b.txid, 0), (c.txid, 0), (c.txid, 1), (c.txid, 2)
    }


def test_a_child_enqueued_before_its_parent_waits_for_it(pipeline: Pipeline) -> None:
    chain, funds, base = seeded(pipeline)
    parent = spend((funds[0], 0), n_outputs=2)
    child = spend((parent, 1), (funds[1], 0))
    pipeline.enqueue("tx", [child.raw])
    time.sleep(1.0)  # the child's task has run and found no parent: it waits
    assert pipeline.tx(child.txid_hex) is None
    assert spent_by(pipeline, funds[1], 0) is None  # nothing of it is spent meanwhile
    assert f"tx:{child.txid_hex}" in pipeline.pending()
    pipeline.enqueue("tx", [parent.raw])
    pipeline.wait()
    unmined(pipeline, parent)
    unmined(pipeline, child)
    assert spent_by(pipeline, parent, 1) == spent_by(pipeline, funds[1], 0) == child.txid_hex
    assert spent_by(pipeline, parent, 0) is None
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)
    assert "retry" in pipeline.log("w1")  # it did wait


def test_what_waits_for_its_parents_says_so(pipeline: Pipeline) -> None:
    """A child waiting for two parents that have not come: `utxo wait` times out (1) naming it
    and what it waits for, `utxo tx` and `utxo status` say the same; once the parents come the
    child is applied and nothing says it waits any more."""
    chain, funds, base = seeded(pipeline)
    p1, p2 = spend((funds[0], 0), n_outputs=2), spend((funds[2], 0))
    child = spend((p1, 1), (funds[1], 0), (p2, 0), (p1, 0))
    pipeline.enqueue("tx", [child.raw])
    why = f"waits for 2 missing parents (the first: {p1.txid_hex})"
    deadline = time.monotonic() + 30
    while True:  # the child's task runs, finds no parents and notes why it waits
        r = pipeline.utxo("wait", "--timeout", "0.5")
        out = json.loads(r.stdout)
        if out.get("waiting") or time.monotonic() > deadline:
            break
    assert r.returncode == 1 and out["waiting"] == 1, r.stdout + r.stderr
    assert out["waiting_for"] == [{"id": f"tx:{child.txid_hex}", "reason": why}], out
    assert f"the longest: tx:{child.txid_hex} {why} (for " in r.stderr, r.stderr
    t = pipeline.utxo("tx", child.txid_hex)
    assert t.returncode == 1, t.stderr
    assert t.stderr.strip().endswith(f"is not in the store: it is pending and {why}"), t.stderr
    status = json.loads(pipeline.utxo("status", "--json").stdout)
    assert status["waiting"]["count"] == 1 and status["waiting"]["longest"][0]["reason"] == why, status
    screen = pipeline.utxo("status").stdout
    assert "waiting (1)" in screen and "waits for 2 missing parents" in screen, screen
    pipeline.enqueue("tx", [p1.raw, p2.raw])
    assert "waiting" not in pipeline.wait()
    unmined(pipeline, child)
    status = json.loads(pipeline.utxo("status", "--json").stdout)
    assert status["waiting"] == {"count": 0, "longest": []}, status
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)


def test_double_spends_of_mempool_txs_by_a_tx_and_by_a_block(pipeline: Pipeline) -> None:
    """A tx double-spending a mempool tx is rejected (the first stays, its spend stands); a
    block that mines the first makes it mined; a block double-spending another mempool tx makes
    that one and its child conflicting, and the block's spend stands."""
    chain, funds, base = seeded(pipeline)
    first = spend((funds[0], 0))
    second = spend((funds[0], 0), fee=2000)  # the same output, another tx
    victim = spend((funds[1], 0), n_outputs=2)
    victim_child = spend((victim, 1))
    pipeline.enqueue("tx", [first.raw, victim.raw, victim_child.raw])
    pipeline.wait()
    pipeline.enqueue("tx", [second.raw])
    waited = pipeline.wait(refused=1)  # exit 4, the refusal listed with the rival that holds the output
    (said,) = waited["refusals"]
    assert said["kind"] == "tx" and said["key"] == second.txid_hex and said["rival"] == first.txid_hex, said
    assert f"already spent by {first.txid_hex}" in said["reason"], said
    r = pipeline.utxo("tx", second.txid_hex)  # not in the store, and why
    assert r.returncode == 1 and "it was refused (" in r.stderr, r.stderr
    assert f"{first.txid_hex} holds what it wanted" in r.stderr, r.stderr
    r = pipeline.utxo("status", "--json")
    assert [t["key"] for t in json.loads(r.stdout)["refused"]["txs"]] == [second.txid_hex], r.stdout
    assert spent_by(pipeline, funds[0], 0) == first.txid_hex
    unmined(pipeline, first)
    assert f"tx {second.txid_hex} rejected" in pipeline.log("w1")
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)

    # a block mines the first: mined at its height, its spend unchanged
    chain.add([first])
    pipeline.enqueue("block", chain.blocks[-1:])
    pipeline.wait()
    meta = tx(pipeline, first)
    assert meta["unmined_since"] is None and meta["block_heights"] == [1001] and not meta["conflicting"]
    assert spent_by(pipeline, funds[0], 0) == first.txid_hex
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)

    # a block double-spends `victim`: it and its child become conflicting
    rival = spend((funds[1], 0), fee=5000)
    chain.add([rival])
    pipeline.enqueue("block", chain.blocks[-1:])
    pipeline.wait()
    assert pipeline.tip()["height"] == 1002
    for t in (victim, victim_child):
        meta = tx(pipeline, t)
        assert meta["conflicting"] and meta["unmined_since"] is not None, meta
    assert spent_by(pipeline, funds[1], 0) == rival.txid_hex
    assert spent_by(pipeline, victim, 1) is None  # the conflicting child's spend is released
    model = confirmed_model(chain.txs, base)
    assert pipeline.confirmed() == model
    assert unconfirmed(pipeline) == model  # nothing unmined and not conflicting is left
    assert pipeline.state_counts() == {"applied": 3}
