"""Two processes spending the same output at the same moment: exactly one wins (every backend)."""

from __future__ import annotations

from typing import Any

from chain import parse_tx
from stores.utxo import SpendRejected, UtxoSpent, UtxoStore, open_utxo_store
from tests.processes import race
from tests.stores.helpers import child, created, funding

ROUNDS = 25


def _racer(url: str, raws: list[bytes], barrier: Any, out: Any) -> None:
    results: list[Any] = []
    try:
        store = open_utxo_store(url)
        for raw in raws:
            tx = parse_tx(raw)
            barrier.wait(timeout=60)
            try:
                store.spend(tx, 101)
                results.append(("won", tx.txid))
            except SpendRejected as e:
                results.append(("lost", e.first.spending_txid) if isinstance(e.first, UtxoSpent) else repr(e))
        store.close()
    except Exception as e:  # reported to the parent at once, not as a queue time-out
        results.append(repr(e))
    finally:
        out.put(results)


def test_two_processes_racing_for_one_output(store: UtxoStore, store_url: str) -> None:
    f = funding(ROUNDS)
    created(store, f)
    sides = []
    for fee in (100, 200):
        # each side carries extended inputs so the store checks the hash as in real use
        sides.append([child((f, v), fee=fee).serialize(extended=True) for v in range(ROUNDS)])
    results = race(_racer, [(store_url, raws) for raws in sides])
    wins = 0
    for v in range(ROUNDS):
        a, b = results[0][v], results[1][v]
        assert {a[0], b[0]} == {"won", "lost"}, (v, a, b)
        winner = a[1] if a[0] == "won" else b[1]
        loser_named = b[1] if a[0] == "won" else a[1]
        assert loser_named == winner  # the loser's error names the winner
        stored = store.get_output((f.txid, v))
        assert stored is not None and stored.spending_txid == winner
        wins += 1
    assert wins == ROUNDS
    assert store.get(f.txid).spent_utxos == ROUNDS
