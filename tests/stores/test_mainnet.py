"""Real data: block 413567 over the outputs it spends, created, spent and mined as one block."""

from __future__ import annotations

import json
from pathlib import Path

from chain import hex_to_hash, parse_block
from stores.utxo import Utxo, UtxoStore

HEIGHT = 413567
SUBSIDY = 25 * 10**8


def _snapshot(data_dir: Path) -> list[Utxo]:
    out = []
    for line in (data_dir / "mainnet-413567.prevouts.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["height"] < HEIGHT:  # outputs created inside the block itself come from the block
            out.append(
                Utxo(
                    hex_to_hash(d["txid"]),
                    d["vout"],
                    d["value"],
                    bytes.fromhex(d["script"]),
                    d["height"],
                    d["coinbase"],
                )
            )
    return out


def test_block_413567_fees_match_the_coinbase(store: UtxoStore, data_dir: Path) -> None:
    snapshot = _snapshot(data_dir)
    assert store.import_utxos(snapshot) == len(snapshot)
    store.set_block_height(HEIGHT)
    block = parse_block((data_dir / "mainnet-413567.block").read_bytes())
    created = store.create_many(block.txs, HEIGHT)
    assert all(not isinstance(m, Exception) for m in created), [
        m for m in created if isinstance(m, Exception)
    ][:3]
    spent = store.spend_many(block.txs, HEIGHT)
    assert all(isinstance(s, list) for s in spent), [s for s in spent if not isinstance(s, list)][:3]
    assert sum(len(s) for s in spent if isinstance(s, list)) == 4886  # every input but the coinbase's
    fees = [m.fee for m in created[1:]]  # type: ignore[union-attr]
    assert all(f is not None and f >= 0 for f in fees)
    coinbase_out = sum(o.satoshis for o in block.txs[0].outputs)
    assert sum(fees) == coinbase_out - SUBSIDY == 31_310_238  # type: ignore[arg-type]
    res = store.set_mined_multi([t.txid for t in block.txs], 1, HEIGHT)
    assert all(r == [1] for r in res)
    # confirmed set: snapshot + block outputs − inputs spent (data carriers excluded)
    from chain import is_data_carrier

    made = sum(1 for t in block.txs for o in t.outputs if not is_data_carrier(o.satoshis, o.script))
    stats = store.stats()
    assert stats.utxos == len(snapshot) + made - 4886
    snap_value = sum(u.satoshis for u in snapshot)
    block_out = sum(o.satoshis for t in block.txs for o in t.outputs)
    # value: every input's value is gone, every output's value is there
    outputs = store.get_outputs([(s.txid, s.vout) for r in spent if isinstance(r, list) for s in r])
    assert len(outputs) == 4886
    input_value = sum(o.satoshis for o in outputs.values())
    assert input_value == (block_out - coinbase_out) + 31_310_238  # non-coinbase outputs + fees
    assert stats.satoshis == snap_value + block_out - input_value
    # a spent parent is fully spent and mined → DAH when all its outputs are gone: from the
    # spend's height for the snapshot's records (mined when spent), from the block after the
    # store's tip for the block's own (mined by set-mined, with the tip already at HEIGHT:
    # Teranode's setMined counts from the tip + 1)
    parent_txids = {i.prev_txid for t in block.txs[1:] for i in t.inputs}
    in_block = {t.txid for t in block.txs}
    fully = [store.get(t) for t in parent_txids]
    done = [m for m in fully if m.spent_utxos == m.total_utxos]
    assert done and any(m.txid in in_block for m in done) and any(m.txid not in in_block for m in done)
    assert all(m.delete_at_height == HEIGHT + (289 if m.txid in in_block else 288) for m in done)
    assert all(m.delete_at_height is None for m in fully if m.spent_utxos < m.total_utxos)
