"""Conformance: a pruning run pages through what is due (`prune_next`), checked against a model
written here: every due record goes or is kept exactly once, parents that stay learn of their
deleted children, and nothing else changes (every backend)."""

from __future__ import annotations

import random

import pytest

from stores.utxo import TxNotFound, UtxoStore
from stores.utxo.values import PruneResult
from tests.stores.helpers import child, created, funding

RET = 288


@pytest.mark.parametrize("defensive", [False, True])
@pytest.mark.parametrize("limit", [1, 3, 50])
def test_paging_through_due_records_matches_a_model(store: UtxoStore, limit: int, defensive: bool) -> None:
    rnd = random.Random(limit * 2 + defensive)
    # parent p (2 outputs) → child c (output 0) → grandchild g; p's output 1 spent by q or not
    n = 24
    ps = [funding(2) for _ in range(n)]
    created(store, *ps, height=100, mined=True)
    cs = [child((p, 0)) for p in ps]
    created(store, *cs, height=101, mined=True)
    for c in cs:
        store.spend(c, 101)
    spent_at = [102 + rnd.randrange(4) for _ in range(n)]  # when c's one output is spent
    g_mined = [rnd.random() < 0.6 for _ in range(n)]  # the spender of c mined (stable) or not
    q_spent = [rnd.random() < 0.5 for _ in range(n)]  # p fully spent (then due too) or not
    for i, c in enumerate(cs):
        store.set_block_height(spent_at[i])
        g = child((c, 0))
        created(store, g, height=spent_at[i], mined=g_mined[i])
        store.spend(g, spent_at[i])
        if q_spent[i]:
            q = child((ps[i], 1))
            created(store, q, height=spent_at[i], mined=True)
            store.spend(q, spent_at[i])
    height = 103 + RET  # c spent at 102 or 103 is due, and p with it when q spent it then
    stable_at = height - RET if defensive else None

    # the model: which records a run at `height` deletes (defensive: their spenders mined)
    def goes(i: int, what: str) -> bool:
        if spent_at[i] + RET > height or (what == "p" and not q_spent[i]):
            return False
        if not defensive:
            return True
        # p's spenders are c (mined at 101) and q (mined); c's is g, stable only when mined
        return what == "p" or g_mined[i]

    due = sum((spent_at[i] + RET <= height) * (1 + q_spent[i]) for i in range(n))
    total, after, sizes = PruneResult(), None, []
    while True:
        r, after = store.prune_next(height, after, limit, stable_at)
        if after is None:
            break
        sizes.append(r.deleted + r.defensive_kept + r.not_due + r.blob_kept)
        total.add(r)
    assert sizes[:-1] == [limit] * (len(sizes) - 1) and 1 <= sizes[-1] <= limit  # every unit full
    want_c = [goes(i, "c") for i in range(n)]
    want_p = [goes(i, "p") for i in range(n)]
    assert total.deleted == sum(want_c) + sum(want_p)
    assert total.deleted + total.defensive_kept == due  # each due record met once
    assert len(sizes) == -(-due // limit)
    for i in range(n):
        for tx, gone in ((cs[i], want_c[i]), (ps[i], want_p[i])):
            if gone:
                with pytest.raises(TxNotFound):
                    store.get(tx.txid)
            else:
                store.get(tx.txid)
        if want_c[i] and not want_p[i]:  # p stays and knows its child went
            assert store.get(ps[i].txid, ["deleted_children"]).deleted_children == [cs[i].txid]
        elif not want_p[i]:
            assert store.get(ps[i].txid, ["deleted_children"]).deleted_children == []
    # a second run finds nothing more to delete
    r, after = store.prune_next(height, None, 10_000, stable_at)
    assert r.deleted == 0 and r.defensive_kept == total.defensive_kept

