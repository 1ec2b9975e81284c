"""`utxo utxos --script/--address/--scripthash` and `utxo balance` over real mainnet blocks 1–255
(applied through the sequencer, read by the `utxo` process): early coinbases pay a public key
(P2PK), so the address of that key finds nothing — with a line saying how to find them — and
the script finds them; a spent coinbase is not listed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from chain import iter_blk_records, parse_block
from tests.cli.test_export import Stores
from tests.cli.test_store_commands import B58


def p2pkh_address_of_key(pubkey: bytes) -> str:
    """The mainnet P2PKH address of a public key, encoded here."""
    h160 = hashlib.new("ripemd160", hashlib.sha256(pubkey).digest()).digest()
    payload = b"\x00" + h160
    data = payload + hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    n, out = int.from_bytes(data, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


@pytest.fixture(scope="module")
def mainnet(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[Stores, list]:  # type: ignore[type-arg]
    stores = Stores.sqlite(tmp_path_factory.mktemp("mainnet-scripts"))
    raws = [raw for _off, raw in iter_blk_records((data_dir / "mainnet-1-255.blk").read_bytes())]
    seq = stores.sequencer()
    try:
        for raw in raws:
            seq.submit(raw)
    finally:
        seq.utxo.close()
        seq.state.close()
    return stores, [parse_block(r) for r in raws]


def test_p2pk_coinbases_are_found_by_script_not_by_address(mainnet: tuple[Stores, list]) -> None:  # type: ignore[type-arg]
    stores, blocks = mainnet
    cb = blocks[0].txs[0]  # block 1's coinbase: 50 BTC to a 65-byte key, never spent
    spk = cb.outputs[0].script
    assert len(spk) == 67 and spk[0] == 0x41 and spk[-1] == 0xAC
    by_address = stores.run("utxos", "--address", p2pkh_address_of_key(spk[1:66]))
    assert by_address.code == 0 and by_address.out == ""
    assert "P2PK" in by_address.err and "--script" in by_address.err
    by_script = stores.run("utxos", "--script", spk.hex())
    assert by_script.code == 0, by_script.err
    (line,) = by_script.lines()
    assert {k: line[k] for k in ("txid", "vout", "satoshis", "height", "coinbase", "confirmed")} == {
        "txid": cb.txid_hex, "vout": 0, "satoshis": 50 * 10**8, "height": 1, "coinbase": True,
        "confirmed": True}
    sh = hashlib.sha256(spk).digest()[::-1].hex()
    assert stores.run("utxos", "--scripthash", sh).lines() == [line]
    assert stores.run("balance", "--scripthash", sh).json() == {
        "confirmed": 50 * 10**8, "unconfirmed": 0, "utxos": 1}


def test_a_spent_coinbase_is_not_listed(mainnet: tuple[Stores, list]) -> None:  # type: ignore[type-arg]
    stores, blocks = mainnet
    spender = next(t for b in blocks for t in b.txs if not t.is_coinbase)  # block 170: the first spend
    spent = next(t for b in blocks for t in b.txs if t.txid == spender.inputs[0].prev_txid)  # block 9's
    spk = spent.outputs[0].script
    want = unspent_paying(blocks, spk)  # (it got change back later, since spent again)
    assert (spent.txid_hex, 0) not in want
    for script in {spk, *(o.script for o in spender.outputs)}:
        want = unspent_paying(blocks, script)
        r = stores.run("utxos", "--script", script.hex())
        assert r.code == 0
        assert {(x["txid"], x["vout"]): (x["satoshis"], x["height"]) for x in r.lines()} == want
        assert stores.run("balance", "--script", script.hex()).json() == {
            "confirmed": sum(v[0] for v in want.values()), "unconfirmed": 0, "utxos": len(want)}


def unspent_paying(blocks: list, spk: bytes) -> dict[tuple[str, int], tuple[int, int]]:  # type: ignore[type-arg]
    """The model: (txid, vout) → (satoshis, height) of the outputs paying `spk` that no later
    block spends (block k is at height k + 1)."""
    paid = {(t.txid_hex, v): (o.satoshis, k + 1) for k, b in enumerate(blocks) for t in b.txs
            for v, o in enumerate(t.outputs) if o.script == spk}
    gone = {(i.prev_txid[::-1].hex(), i.prev_vout) for b in blocks for t in b.txs if not t.is_coinbase
            for i in t.inputs}
    return {op: v for op, v in paid.items() if op not in gone}
