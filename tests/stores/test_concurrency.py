"""Several worker processes hammering one store with overlapping batches (every backend).

Each process creates the same transactions (shuffled), spends them with its own conflicting
children, and mines what it won — as redelivered and racing Celery tasks would. Afterwards the
invariants of the record model must hold: every output is spent at most once, by a tx that is
stored, each record's spent counter equals its spent slots, and no process saw anything but
TxExists or UtxoSpent for its losing attempts.
"""

from __future__ import annotations

import random
from typing import Any

from chain import parse_tx
from stores.utxo import SpendRejected, TxExists, UtxoSpent, UtxoStore, open_utxo_store
from tests.processes import race
from tests.stores.helpers import child, funding

WORKERS = 3
PARENTS = 60


def _worker(url: str, seed: int, parents: list[bytes], kids: list[bytes], barrier: Any, out: Any) -> None:
    try:
        _work(url, seed, parents, kids, barrier, out)
    except Exception as e:  # reported to the parent at once, not as a queue time-out
        out.put(([repr(e)], []))


def _work(url: str, seed: int, parents: list[bytes], kids: list[bytes], barrier: Any, out: Any) -> None:
    rng = random.Random(seed)
    store = open_utxo_store(url)
    ps = [parse_tx(r) for r in parents]
    ks = [parse_tx(r) for r in kids]
    unexpected: list[str] = []
    won: list[bytes] = []
    barrier.wait(timeout=60)
    for _round in range(3):
        rng.shuffle(ps)
        for r in store.create_many(ps, 100):
            if isinstance(r, Exception) and not isinstance(r, TxExists):
                unexpected.append(repr(r))
        mine = rng.sample(ks, len(ks) // 2)
        for r in store.create_many(mine, 100):
            if isinstance(r, Exception) and not isinstance(r, TxExists):
                unexpected.append(repr(r))
        for tx, r in zip(mine, store.spend_many(mine, 101)):
            if isinstance(r, SpendRejected):
                if not all(isinstance(e, UtxoSpent) for _v, e in r.errors):
                    unexpected.append(repr(r))
            else:
                won.append(tx.txid)
        for r in store.set_mined_multi([t.txid for t in ps], 1, 100):
            if isinstance(r, Exception):
                unexpected.append(repr(r))
    store.close()
    out.put((unexpected, won))


def test_workers_racing_on_overlapping_batches(store: UtxoStore, store_url: str) -> None:
    parents = [funding(2) for _ in range(PARENTS)]
    # every worker may try every child; children of one parent output conflict with each other
    kids = [child((p, v), fee=100 + w) for p in parents for v in (0, 1) for w in range(WORKERS)]
    raws_p = [p.raw for p in parents]
    raws_k = [k.serialize(extended=True) for k in kids]
    results = race(_worker, [(store_url, seed, raws_p, raws_k) for seed in range(WORKERS)], timeout=240)
    assert [u for u, _w in results] == [[]] * WORKERS
    spenders = {k.txid: k for k in kids}
    winners = {t for _u, w in results for t in w}
    for p in parents:
        meta = store.get(p.txid)
        assert meta.block_ids == [1] and meta.unmined_since is None
        outs = [store.get_output((p.txid, v)) for v in (0, 1)]
        spent = [o for o in outs if o is not None and o.spending_txid is not None]
        assert meta.spent_utxos == len(spent)
        for o in spent:
            assert o.spending_txid in spenders and o.spending_txid in winners
            store.get(o.spending_txid)  # the spender is stored
    # every output somebody tried to spend was won by exactly one child
    assert sum(store.get(p.txid).spent_utxos for p in parents) == 2 * PARENTS
    assert len(winners) == 2 * PARENTS
