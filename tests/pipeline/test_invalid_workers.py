"""Every kind of invalid block, through two real workers: each is refused whole with its reason
(CONTRACT "Chain rules"), whether its check is up front (proof of work, merkle root, repeated
txid) or meets the store in a unit of a shared phase (missing input, double spends, immature
coinbase), the tip stays, and a valid sibling that follows is applied. Blocks carry a few dozen
transactions, so that a refusal in one unit lands while the other worker runs others."""

from __future__ import annotations

import json

import pytest

from chain import parse_block
from chain.build import build_tx
from tests.pipeline.chains import Chain, confirmed_model, funding, outpoints, script, spend
from tests.pipeline.test_invalid_blocks import missing, patch_header
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (the fixture)


@pytest.mark.timeout(300)
def test_every_invalid_block_is_refused_through_two_workers(pipeline: Pipeline) -> None:
    funds = funding(400)
    base = outpoints(funds)
    chain: Chain = pipeline.seed(funds)
    coins = iter(funds)

    def filler(n: int = 30) -> list:  # type: ignore[type-arg]
        return [spend((next(coins), 0)) for _ in range(n)]

    chain.add(filler())  # the tip the invalid blocks build on
    a, twin = filler(1)[0], next(coins)
    good = chain.next_block(filler())
    cases = {
        "proof of work": patch_header(chain.next_block(filler()), bits=0x1D00FFFF),
        "merkle root does not match": good[:-1] + bytes([good[-1] ^ 1]),
        f"repeats tx {a.txid_hex}": chain.next_block([a, *filler(), a, *filler(2)]),
        "missing output": chain.next_block(
            [*filler(), build_tx([missing()], [(10**8, script())]), *filler()]),
        "double spend within the block": chain.next_block(
            [*filler(), spend((twin, 0)), *filler(), spend((twin, 0), fee=2000)]),
        "already spent on this chain": chain.next_block(
            [*filler(), spend((funds[0], 0), fee=5000), *filler()]),  # the tip spent funds[0]
        "immature coinbase": chain.next_block([*filler(), spend((chain.txs[-1][0], 0)), *filler()]),
    }
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    # The cases are siblings of equal work, and a tie keeps the block indexed first. Two workers
    # index in whatever order they take the messages, so while no valid sibling is known each
    # case becomes the best chain in turn and is tried (and refused); a valid sibling indexed
    # before a case whose check needs the chain's state would rightly leave that case `side`,
    # never tried. So the valid sibling comes once every case has been refused. The cases are
    # sent past `utxo enqueue`'s checks: it refuses those invalid on their own at the door.
    pipeline.enqueue("block", chain.blocks)
    pipeline.submit("block", list(cases.values()))
    pipeline.wait(240)
    for reason, raw in cases.items():
        r = pipeline.utxo("block", parse_block(raw).hash[::-1].hex())
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["status"] == "invalid" and reason in got["reason"], (reason, got)
    tip = json.loads(pipeline.utxo("tip").stdout)
    assert tip["hash"] == parse_block(chain.blocks[-1]).hash[::-1].hex()  # refusals never move it
    chain.add(filler())  # valid, a sibling of them all
    pipeline.enqueue("block", [chain.blocks[-1]])
    pipeline.wait(60)
    tip = json.loads(pipeline.utxo("tip").stdout)
    assert tip["hash"] == parse_block(chain.blocks[-1]).hash[::-1].hex()
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)  # nothing of them remains
    assert "Traceback" not in pipeline.logs()
