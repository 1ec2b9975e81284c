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
from stores.blob import open_blob_store
from stores.blob.protocol import blob_key
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
    pipeline.wait(240, refused=len(cases))
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


@pytest.mark.timeout(180)
def test_a_stored_block_that_does_not_parse_is_refused_as_corrupt_until_a_good_copy_comes(
    pipeline: Pipeline,
) -> None:
    """Its bytes in the blob store go bad after `utxo enqueue` indexed it (cut short): the
    holder refuses it as corrupt rather than try the same bytes every 10 s for ever, `utxo wait`
    says so, and `utxo enqueue` of the good bytes replaces the copy and the chain goes on."""
    c = Chain()
    for _ in range(3):
        c.add()
    pipeline.enqueue("block", c.blocks)  # stored and indexed at the door; no worker yet
    hexed = [parse_block(b).hash[::-1].hex() for b in c.blocks]
    blobs = open_blob_store(pipeline.env["UTXO_BLOB_URL"])
    key = blob_key(parse_block(c.blocks[1]).hash, "block")
    blobs.delete(key)
    assert blobs.put_if_absent(key, c.blocks[1][:100])
    pipeline.start_worker("w1")
    (said,) = pipeline.wait(60, refused=1)["refusals"]
    assert said["key"] == hexed[1] and "the stored copy of block" in said["reason"], said
    assert "does not parse" in said["reason"] and "enqueue the block again" in said["reason"], said
    assert pipeline.tip()["hash"] == hexed[0]
    third = json.loads(pipeline.utxo("block", hexed[2]).stdout)
    assert third["status"] == "invalid" and third["reason"] == "its parent is invalid", third
    assert "will retry" not in pipeline.log("w1"), pipeline.log("w1")
    pipeline.enqueue("block", c.blocks[1:2])  # the good bytes
    pipeline.wait(60)
    assert pipeline.tip()["hash"] == hexed[2]
    assert blobs.get(key) == c.blocks[1]
