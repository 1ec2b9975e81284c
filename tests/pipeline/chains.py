"""Generated chains for the pipeline tests: blocks with valid (regtest-easy) proof of work whose
transactions spend earlier outputs, and an independent model of the confirmed UTXO set (the
branch and the model live in workers.demo.demochain, which `utxo demo` uses too)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from chain import Tx, TxIn
from chain.build import build_tx, spend_input
from chain.muhash import MuHash, coin_bytes
from chain.tx import varint
from stores.utxo import Utxo, UtxoStore
from workers.demo.demochain import TAGS, tag_script
from workers.demo.demochain import Branch as Chain

_tag = TAGS  # one counter with Chain's coinbases: every script and coinbase tag is new


def script(n: int | None = None) -> bytes:
    return tag_script(next(_tag) if n is None else n)


def spend(*outs: tuple[Tx, int], n_outputs: int = 1, fee: int = 1000) -> Tx:
    total = sum(t.outputs[v].satoshis for t, v in outs) - fee
    ins = [spend_input(t, v) for t, v in outs]
    return build_tx(ins, [(total // n_outputs, script()) for _ in range(n_outputs)])


def confirmed_model(
    blocks: list[list[Tx]], base: Iterable[tuple[bytes, int]] = ()
) -> set[tuple[bytes, int]]:
    """The confirmed UTXO set a chain of blocks gives (over the outputs `base` of a snapshot),
    computed here, independently of the store and of the package (the demo has its own)."""
    utxos: set[tuple[bytes, int]] = set(base)
    for txs in blocks:
        for tx in txs:
            if not tx.is_coinbase:
                for i in tx.inputs:
                    utxos.discard((i.prev_txid, i.prev_vout))
            for v, o in enumerate(tx.outputs):
                if not (o.satoshis == 0 and (o.script[:1] == b"\x6a" or o.script[:2] == b"\x00\x6a")):
                    utxos.add((tx.txid, v))
    return utxos


def commitment_model(
    blocks: Sequence[Sequence[Tx]], first_height: int, base: Iterable[Utxo] = ()
) -> tuple[str, int, int]:
    """(MuHash as Core prints it, outputs, satoshis) of the confirmed set a chain gives (block k
    at `first_height` + k, over the snapshot's outputs `base`), one coin at a time with the
    primitive's plain `insert`: nothing of the store or of the incremental commitment."""
    coins: dict[tuple[bytes, int], tuple[int, bool, int, bytes]] = {
        (u.txid, u.vout): (u.height or 0, u.coinbase, u.satoshis, u.script) for u in base
    }
    for k, txs in enumerate(blocks):
        for tx in txs:
            if not tx.is_coinbase:
                for i in tx.inputs:
                    coins.pop((i.prev_txid, i.prev_vout), None)
            for v, o in enumerate(tx.outputs):
                if not (o.satoshis == 0 and (o.script[:1] == b"\x6a" or o.script[:2] == b"\x00\x6a")):
                    coins[(tx.txid, v)] = (first_height + k, tx.is_coinbase, o.satoshis, o.script)
    h = MuHash()
    for (t, v), (height, cb, sats, spk) in coins.items():
        h.insert(coin_bytes(t, v, height, cb, sats, spk))
    return h.hex(), len(coins), sum(c[2] for c in coins.values())


def funding(n: int, satoshis: int = 10**8, n_outputs: int = 1) -> list[Tx]:
    """Transactions known to the store only through a UTXO snapshot (`snapshot_utxos`): their
    inputs name nothing real, so a generated chain can spend their outputs at once, without
    waiting 100 blocks for a coinbase to mature."""
    out = []
    for _ in range(n):
        tag = next(_tag).to_bytes(32, "big")
        outs = [(satoshis, script()) for _ in range(n_outputs)]
        out.append(build_tx([TxIn(tag, 0, b"\x51", 0xFFFFFFFF)], outs))
    return out


def snapshot_utxos(txs: Sequence[Tx], height: int, coinbase: bool = False) -> list[Utxo]:
    """Every output of `txs` as snapshot entries created at `height`."""
    return [
        Utxo(t.txid, v, o.satoshis, o.script, height, coinbase) for t in txs for v, o in enumerate(t.outputs)
    ]


def outpoints(txs: Sequence[Tx]) -> set[tuple[bytes, int]]:
    return {(t.txid, v) for t in txs for v in range(len(t.outputs))}


def assemble(header: bytes, txs: Sequence[Tx]) -> bytes:
    """A block's bytes from an 80-byte header and any list of transactions (a root that does
    not match, or a repeated transaction, is the point)."""
    assert len(header) == 80
    return header + varint(len(txs)) + b"".join(t.raw for t in txs)


SNAPSHOT_HEIGHT = 1000
SNAPSHOT_HASH = bytes.fromhex("5e" * 32)  # a block the chain starts from, known only by hash


def seed(
    utxo: UtxoStore, txs: Sequence[Tx], *, coinbase: Sequence[Tx] = (), coinbase_height: int = 0
) -> Chain:
    """Seed an empty store with a snapshot at SNAPSHOT_HEIGHT holding every output of `txs`
    (and of the `coinbase` ones, created at `coinbase_height`); the branch that continues it."""
    utxos = snapshot_utxos(txs, SNAPSHOT_HEIGHT) + snapshot_utxos(coinbase, coinbase_height, coinbase=True)
    utxo.import_utxos(utxos, height=SNAPSHOT_HEIGHT, block_hash=SNAPSHOT_HASH)
    return Chain(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1)


def confirmed(utxo: UtxoStore) -> set[tuple[bytes, int]]:
    """The store's confirmed UTXO set, as outpoints."""
    return {(u.txid, u.vout) for u in utxo.iter_utxos(confirmed=True)}
