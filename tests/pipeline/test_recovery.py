"""The recovery manager on a real pipeline: `utxo recover --once` (and `utxo recover`) against
a real worker, real Redis and real stores. Every mempool transaction's entry goes from pending
to exactly one terminal status and never back, as a model written here says it must:

  a  accepted, then mined                       → confirmed
  b  double-spends a (refused by its task)       → refused, checked again; deleted after the grace
  c  its message lost, its parent unknown        → not found, then orphan after the grace period
  d  accepted, then a block mines a rival        → conflicting, checked again; deleted after the grace
  e  its message lost: blob, no record           → processed again by the manager, then confirmed
  f  accepted, never mined                       → stays pending (unmined), checked every scan

and a verdict is final only once it is (issue 40): a tx that lost a mempool race which a block
then mines is `confirmed`, and one spending a coinbase not mature yet is tried again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from chain import Tx
from tests.pipeline.chains import funding, spend
from tests.pipeline.workers import Pipeline, pipeline_fixture, until  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(180)
GRACE = 20.0  # longer than the steps before the last scan take


def recover(pipeline: Pipeline, *args: str) -> dict[str, Any]:
    r = pipeline.utxo("recover", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def outcomes(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """ident → (status, outcome) of what one scan handled."""
    return {h["ident"]: (h["status"], h["outcome"]) for h in report.get("handled", [])}


def raws(*txs: Tx) -> list[bytes]:
    return [t.raw for t in txs]


def ident(t: Tx) -> str:
    return f"tx:{t.txid_hex}"


def test_every_transition_of_a_mempool_tx(pipeline: Pipeline) -> None:
    env = pipeline.env
    env.update({
        "UTXO_RECOVERY_ENABLED": "false",  # only the scans this test runs
        "UTXO_RECOVERY_TTL": "0",
        "UTXO_RECOVERY_NOT_FOUND_GRACE": str(GRACE),
        "UTXO_REQUEUE_AFTER": "1h",  # nothing re-sent behind the test's back
    })
    funds = funding(4, n_outputs=2)
    chain = pipeline.seed(funds)
    ghost = funding(1)[0]  # never in the store
    a, d, f = spend((funds[0], 0)), spend((funds[1], 0)), spend((funds[3], 0))
    b = spend((funds[0], 0), n_outputs=2)  # a's rival
    c, e = spend((ghost, 0)), spend((funds[2], 0))

    # c and e: enqueued (bytes kept, entry registered), their messages then lost
    pipeline.enqueue("tx", raws(c, e))
    assert pipeline.redis.llen("txs") == 1  # (one message: a batch of the two)
    pipeline.redis.delete("txs")
    pipeline.start_worker("w1")
    pipeline.enqueue("tx", raws(a, d, f))
    until(lambda: all(pipeline.tx(t.txid_hex) for t in (a, d, f)), 30, why="a, d and f accepted")
    enqueued_b = time.time()
    pipeline.enqueue("tx", raws(b))
    until(lambda: ident(b) not in pipeline.pending(), 30, why="b refused")
    assert pipeline.tx(b.txid_hex) is None and pipeline.tx(e.txid_hex) is None

    first = recover(pipeline, "--once")
    got = outcomes(first)
    assert set(first["claimed"]) == {ident(t) for t in (a, b, c, d, e, f)}
    assert got[ident(a)][0] == got[ident(d)][0] == got[ident(f)][0] == "pending"
    assert got[ident(a)][1].startswith("unmined")
    # b's refusal is final only after the grace: a block may yet mine b (issue 40, 4)
    assert got[ident(b)][0] == "pending" and got[ident(b)][1].startswith("refused: checked again")
    assert got[ident(c)] == ("pending", got[ident(c)][1]) and got[ident(c)][1].startswith("not found")
    assert got[ident(e)][0] == "pending" and got[ident(e)][1].startswith("unmined")  # made, just now
    made = pipeline.tx(e.txid_hex)
    assert made is not None and made["unmined_since"] is not None

    rival = spend((funds[1], 0), n_outputs=2)  # d's inputs, spent by a block
    chain.add([a, e, rival])
    pipeline.enqueue("block", [chain.blocks[-1]])
    until(lambda: pipeline.tip()["height"] == chain.height - 1, 30, why="the block applied")

    second = outcomes(recover(pipeline, "--once"))
    assert second[ident(a)][0] == second[ident(e)][0] == "confirmed"
    assert second[ident(a)][1] == f"confirmed: mined at height {chain.height - 1}"
    assert second[ident(d)][0] == "pending" and second[ident(d)][1].startswith("conflicting: checked again")
    assert second[ident(f)][0] == "pending" and second[ident(b)][0] == "pending"
    assert second[ident(c)][0] == "pending" and second[ident(c)][1].startswith("not found")

    time.sleep(max(0.0, enqueued_b + GRACE + 0.5 - time.time()))  # (b came after c)
    third = outcomes(recover(pipeline, "--once"))
    assert set(third) == {ident(b), ident(c), ident(d), ident(f)}  # only what is still pending
    assert third[ident(c)][0] == "orphan" and "its parents are not in the store" in third[ident(c)][1]
    assert third[ident(b)][0] == "deleted" and third[ident(b)][1].startswith("deleted: refused")
    assert third[ident(d)] == ("deleted", "deleted: conflicting")
    assert third[ident(f)][0] == "pending"

    # never back: enqueued again, scanned again — terminal entries stay where they are
    pipeline.enqueue("tx", raws(a, d))
    assert {r["key"] for r in pipeline.wait(30, refused=2)["refusals"]} == {b.txid_hex, d.txid_hex}
    assert set(outcomes(recover(pipeline, "--once"))) == {ident(f)}
    status = recover(pipeline)
    assert status["states"] == {"tx": {"confirmed": 2, "deleted": 2, "orphan": 1, "pending": 1}}
    assert status["outcomes"]["tx"] == {
        "confirmed": 2, "deleted": 2, "orphan": 1, "not found": 2, "unmined": 7, "refused": 2,
        "conflicting": 1,
    }
    assert status["leader"] is None  # --once lets go when done
    assert status["last"][0]["ident"] == ident(f)
    assert ident(c) not in pipeline.pending()  # the orphan's message has nothing left to do
    state = pipeline.open_state()  # the bytes kept: only what may still be applied again
    try:
        assert set(state.tx_bytes([ident(t) for t in (a, b, c, d, e, f)])) == {ident(f)}
    finally:
        state.close()


def test_a_refusal_a_block_overturns_and_an_immature_spend_end_confirmed(pipeline: Pipeline) -> None:
    pipeline.env.update({
        "UTXO_RECOVERY_ENABLED": "false", "UTXO_RECOVERY_TTL": "0",
        "UTXO_RECOVERY_NOT_FOUND_GRACE": "600", "UTXO_REQUEUE_AFTER": "1h",
    })
    from chain.build import coinbase_tx
    from tests.pipeline.chains import SNAPSHOT_HEIGHT, script, seed

    funds = funding(2)
    young = coinbase_tx(SNAPSHOT_HEIGHT - 98, [(50 * 10**8, script())])  # spendable from the block after next
    store = pipeline.open_utxo()
    try:
        chain = seed(store, funds, coinbase=[young], coinbase_height=SNAPSHOT_HEIGHT - 98)
    finally:
        store.close()
    pipeline.start_worker("w1")
    a, b = spend((funds[0], 0)), spend((funds[0], 0), fee=2000)  # b loses the race to a
    early = spend((young, 0))
    pipeline.enqueue("tx", raws(a))
    pipeline.wait(30)
    pipeline.enqueue("tx", raws(b, early))
    pipeline.wait(30, refused=2)
    first = outcomes(recover(pipeline, "--once"))
    assert first[ident(b)][0] == "pending" and first[ident(b)][1].startswith("refused: checked again")
    assert first[ident(early)][0] == "pending" and "not spendable yet" in first[ident(early)][1], first
    chain.add([b])  # the chain takes b: a becomes conflicting
    pipeline.enqueue("block", chain.blocks[-1:])
    pipeline.wait(30)
    second = outcomes(recover(pipeline, "--once"))
    assert second[ident(b)] == ("confirmed", f"confirmed: mined at height {SNAPSHOT_HEIGHT + 1}"), second
    assert second[ident(a)][0] == "pending" and second[ident(a)][1].startswith("conflicting"), second
    assert second[ident(early)][0] == "pending" and second[ident(early)][1].startswith("unmined"), second
    chain.add([early])
    pipeline.enqueue("block", chain.blocks[-1:])
    pipeline.wait(30)
    third = outcomes(recover(pipeline, "--once"))
    assert third[ident(early)][0] == "confirmed", third


def send_late(pipeline: Pipeline, *txs: Tx) -> None:
    """A copy of the txs' batch message that comes late (a redelivery, a re-send): registered
    again as the re-sending scan does, and sent, while no bytes of theirs are kept anywhere."""
    for t in txs:
        pipeline.register(ident(t))
    args = [[t.txid_hex for t in txs], [ident(t) for t in txs]]
    code = f"from workers.runtime.app import app; app.send_task('utxoflow.txs.arrived', args={args!r})"
    subprocess.run([sys.executable, "-c", code], env=pipeline.env, cwd=pipeline.tmp, check=True, timeout=60)


def test_a_late_copy_of_a_settled_txs_message_is_no_refusal(pipeline: Pipeline) -> None:
    """a is accepted, mined and confirmed by the recovery manager, c is never found (orphan):
    both entries end, and their kept bytes with them. A copy of their message that comes then
    finds no bytes: a is answered as known (its record is there), c is finished as its verdict
    left it; neither is refused, and `utxo wait` exits 0."""
    pipeline.env.update({
        "UTXO_RECOVERY_ENABLED": "false", "UTXO_RECOVERY_TTL": "0",
        "UTXO_RECOVERY_NOT_FOUND_GRACE": "1", "UTXO_REQUEUE_AFTER": "1h",
    })
    funds = funding(2)
    chain = pipeline.seed(funds)
    a, c = spend((funds[0], 0)), spend((funding(1)[0], 0))  # c's parent: never in the store
    pipeline.enqueue("tx", raws(c))
    pipeline.redis.delete("txs")  # c's message lost: only the manager can settle it
    pipeline.start_worker("w1")
    pipeline.enqueue("tx", raws(a))
    until(lambda: pipeline.tx(a.txid_hex), 30, why="a accepted")
    chain.add([a])
    pipeline.enqueue("block", [chain.blocks[-1]])
    until(lambda: pipeline.tip()["height"] == chain.height - 1, 30, why="a mined")
    time.sleep(1.2)  # past c's grace
    got = outcomes(recover(pipeline, "--once"))
    assert got[ident(a)][0] == "confirmed" and got[ident(c)][0] == "orphan", got
    recover(pipeline, "--once")  # (c's message was still pending when its entry ended: the sweep)
    state = pipeline.open_state()
    try:
        assert state.tx_bytes([ident(a), ident(c)]) == {}
    finally:
        state.close()
    send_late(pipeline, a, c)
    out = pipeline.wait(30, refused=0)
    assert out == {"done": True, "pending": 0, "refused": 0}, out
    assert "rejected" not in pipeline.log("w1"), pipeline.log("w1")
    assert pipeline.tx(c.txid_hex) is None and pipeline.tx(a.txid_hex) is not None
