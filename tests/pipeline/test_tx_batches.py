"""Transactions in batches (`workers.chainstate.mempool.apply_txs`, the `utxoflow.txs.arrived`
task, `utxo enqueue tx` sending a message per batch): the same answers as one at a time in the
batch's order, with parents and children in a batch in any order, double spends inside a batch
and across batches, a worker killed mid-batch and Redis restarted mid-burst. Checked against a
model written here."""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chain import Tx
from chain.build import build_tx, spend_input
from stores.blob.protocol import blob_key
from stores.errors import ProcessingError
from stores.utxo import SpendRejected, TxNotFound, UtxoSpent, UtxoStore, open_utxo_store
from tests.aerospike_server import drop_set, needs_aerospike, new_url
from tests.pipeline.chains import funding, script, seed, spend
from tests.pipeline.conftest import drop_tables
from tests.pipeline.redis_server import RedisServer, broker_fixture  # noqa: F401  (the fixture)
from tests.pipeline.workers import Pipeline, children, faults, pipeline_fixture, until  # noqa: F401
from workers.chainstate.mempool import apply_txs, runs
from workers.runtime.ingest import TX_BATCH
from workers.runtime.txsource import INLINE_TX_MAX

Outpoint = tuple[bytes, int]


# -- a burst and its model -------------------------------------------------------------------------
@dataclass
class Burst:
    """Transactions spending a funding set and one another, generated in an order where every
    parent comes first; `rivals` are those made to double-spend an output an earlier one spends."""

    funds: list[Tx]
    txs: list[Tx] = field(default_factory=list)
    rivals: set[bytes] = field(default_factory=set)


def make_burst(
    seed_: int, n: int, n_funds: int = 30, double_spends: float = 0.08, leaf_rivals: bool = False
) -> Burst:
    """`n` txs in an order where every parent comes first, a share of them double-spending an
    output an earlier tx spends. With `leaf_rivals`, neither side of a double spend has children
    in the burst: whichever wins, no tx waits for a parent that never comes (so the outcome
    across batches taken by several workers in any order is still one of each pair)."""
    rnd = random.Random(seed_)
    b = Burst(funding(n_funds, n_outputs=2))
    unspent: list[Outpoint] = [(f.txid, v) for f in b.funds for v in range(2)]
    spent: list[tuple[Outpoint, bytes]] = []  # (an output, the tx spending it) a rival may take
    by_id = {f.txid: f for f in b.funds}
    for _ in range(n):
        if spent and rnd.random() < double_spends:
            o, first = spent.pop(rnd.randrange(len(spent))) if leaf_rivals else rnd.choice(spent)
            if leaf_rivals:  # no child for either side: the first's outputs are never spent
                unspent = [u for u in unspent if u[0] != first]
                spent = [(u, t) for u, t in spent if t != first]
            tx = spend((by_id[o[0]], o[1]), n_outputs=2, fee=1000 + len(b.txs))
            b.txs.append(tx)
            b.rivals.add(tx.txid)
            continue
        k = min(len(unspent), rnd.choice((1, 1, 2)))
        ins = [unspent.pop(rnd.randrange(len(unspent))) for _ in range(k)]
        if not ins:
            break
        tx = spend(*((by_id[t], v) for t, v in ins), n_outputs=2, fee=1000 + len(b.txs))
        b.txs.append(tx)
        by_id[tx.txid] = tx
        if leaf_rivals:  # the parents now have a child: no rival for their outputs any more
            parents = {t for t, _v in ins}
            spent = [(u, t) for u, t in spent if t not in parents]
        spent += [(o, tx.txid) for o in ins]
        unspent += [(tx.txid, v) for v, out in enumerate(tx.outputs) if out.satoshis > 3000]
    return b


@dataclass
class Model:
    """The mempool after batches, applied one after another: who holds each output, which txs
    have records, and each answer ("made", "known", "waiting", or ("spent", the rival))."""

    holder: dict[Outpoint, bytes | None]
    made: set[bytes] = field(default_factory=set)

    @classmethod
    def over(cls, funds: list[Tx]) -> Model:
        return cls({(f.txid, v): None for f in funds for v in range(len(f.outputs))})

    def apply(self, batch: list[Tx]) -> dict[bytes, object]:
        """The batch one tx at a time, in its order: what a batch must answer."""
        answers: dict[bytes, object] = {}
        for t in batch:
            ins = [(i.prev_txid, i.prev_vout) for i in t.inputs]
            taken = next((self.holder[o] for o in ins if self.holder.get(o) not in (None, t.txid)), None)
            if taken is not None:
                answers[t.txid] = ("spent", taken)
            elif any(o not in self.holder for o in ins):
                answers[t.txid] = "waiting"  # a parent with no record (refused, or not come yet)
            else:
                for o in ins:
                    self.holder[o] = t.txid
                if t.txid in self.made:
                    answers[t.txid] = "known"
                else:
                    self.made.add(t.txid)
                    answers[t.txid] = "made"
                    self.holder.update(((t.txid, v), None) for v in range(len(t.outputs)))
        return answers

    def unspent(self) -> set[Outpoint]:
        return {o for o, h in self.holder.items() if h is None}


def answer(a: object) -> object:
    """What `apply_txs` answered, in the model's terms."""
    if a is True:
        return "made"
    if a is False:
        return "known"
    assert isinstance(a, SpendRejected), a
    errors = [e for _v, e in a.errors]
    if all(isinstance(e, TxNotFound) for e in errors):
        return "waiting"
    spent = [e for e in errors if isinstance(e, UtxoSpent)]
    assert spent, a
    return ("spent", spent[0].spending_txid)


def batches(b: Burst, size: int, rnd: random.Random) -> list[list[Tx]]:
    """The burst cut in batches in its order, each shuffled (children before their parents)."""
    out = [b.txs[k:k + size] for k in range(0, len(b.txs), size)]
    for part in out:
        rnd.shuffle(part)
    return out


# -- the store, no workers -----------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgresql", pytest.param("aerospike", marks=needs_aerospike)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UtxoStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/utxo.db"
    elif request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
        drop_tables(url)
    else:
        url = new_url()
    s = open_utxo_store(url, blob_url=f"file://{tmp_path}/blobs")
    yield s
    s.close()
    if request.param == "aerospike":
        drop_set(None, url)


def test_runs_cut_before_a_child_of_the_run() -> None:
    f = funding(2, n_outputs=2)
    a, b = spend((f[0], 0)), spend((f[0], 1))
    c = spend((a, 0), (b, 0))
    d = spend((c, 0))
    e = spend((f[1], 0))
    def ids(txs: list[Tx]) -> list[list[bytes]]:
        return [[t.txid for t in r] for r in runs(txs)]

    assert ids([a, b, e, c, d]) == [[a.txid, b.txid, e.txid], [c.txid], [d.txid]]
    assert ids([d, c, e, b, a]) == [[d.txid, c.txid, e.txid, b.txid, a.txid]]  # (children first: they wait)
    assert runs([]) == []
    chain = [spend((f[1], 1))]
    for _ in range(3000):  # a long chain of children: a run each
        chain.append(spend((chain[-1], 0), fee=10))
    assert [len(r) for r in runs(chain)] == [1] * len(chain)


@pytest.mark.parametrize("burst_seed", [3, 11])
def test_batches_answer_as_the_model_does(store: UtxoStore, burst_seed: int) -> None:
    """Random bursts (children before parents in a batch, double spends inside one batch and
    across batches, a tx in two batches), applied batch after batch: every answer, who holds
    every output and which txs have records are those of applying them one at a time."""
    rnd = random.Random(burst_seed)
    b = make_burst(burst_seed, 400)
    seed(store, b.funds)
    model = Model.over(b.funds)
    parts = batches(b, 60, rnd)
    parts.append(rnd.sample(b.txs, 40))  # sent again: known, or refused again, as the model says
    waited: list[Tx] = []
    for _round in range(4):  # the waiting ones again, in the burst's order, as the task retries them
        for part in parts:
            want = model.apply(part)
            got = dict(zip((t.txid for t in part), map(answer, apply_txs(store, part))))
            assert got == want
            waited += [t for t in part if want[t.txid] == "waiting"]
        again = {t.txid for t in waited}
        parts = [[t for t in b.txs if t.txid in again]] if again else []
        waited = []
    assert len(model.made) > 200 and len(b.rivals) > 15  # (the burst meant something)
    assert store.existing([t.txid for t in b.txs]) == model.made
    live = {(u.txid, u.vout) for u in store.iter_utxos(confirmed=False)}
    assert live == model.unspent()
    ops = list(model.holder)
    held = store.spenders(ops)
    assert {o: held.get(o) for o in ops} == model.holder


def test_a_tx_the_store_will_not_make_is_refused_alone(store: UtxoStore) -> None:
    """A tx that parses but whose record the store refuses (no outputs: a ProcessingError, not a
    failure of the store) is that tx's refusal: its spend is taken back, and the rest of its
    batch, its child's run included, is applied as one at a time would."""
    f = funding(3)
    seed(store, f)
    a, c = spend((f[0], 0)), spend((f[2], 0))
    bad = build_tx([spend_input(f[1], 0)], [])
    child = spend((a, 0))
    got = apply_txs(store, [a, bad, c, child])
    assert got[0] is True and got[2] is True and got[3] is True
    assert isinstance(got[1], ProcessingError) and "output" in str(got[1]), got[1]
    assert store.existing([t.txid for t in (a, bad, c, child)]) == {a.txid, c.txid, child.txid}
    assert store.spenders([(f[1].txid, 0)]) == {(f[1].txid, 0): None}  # bad's spend taken back


# -- real workers -------------------------------------------------------------------------------
def check_burst(pipeline: Pipeline, b: Burst) -> None:
    """After `utxo wait`: each double-spend pair has exactly one tx with a record, and every
    output is held by the tx with a record that spends it, or by none; every refused tx was
    logged with the reason and a rival that has a record; the mempool's outputs are those of
    the txs with records, less what they spend."""
    store = pipeline.open_utxo()
    state = pipeline.open_state()
    try:
        made = store.existing([t.txid for t in b.txs])
        by_input: dict[Outpoint, list[Tx]] = {}
        for t in b.txs:
            for i in t.inputs:
                by_input.setdefault((i.prev_txid, i.prev_vout), []).append(t)
        held = store.spenders(list(by_input))
        for o, spenders in by_input.items():  # (a tx that lost one input holds none: all or nothing)
            winners = [t for t in spenders if t.txid in made]
            assert len(winners) == (1 if len(spenders) > 1 else len(winners)) <= 1, (o, spenders)
            assert held[o] == (winners[0].txid if winners else None)
        refused = [t for t in b.txs if t.txid not in made]
        logged = state.refusals([f"tx:{t.txid_hex}" for t in refused])
        for t in refused:
            r = logged[f"tx:{t.txid_hex}"]
            assert "spent" in r.reason and r.rival is not None and bytes.fromhex(r.rival)[::-1] in made, r
        outputs = {(f.txid, v) for f in b.funds for v in range(2)}
        outputs |= {(t.txid, v) for t in b.txs if t.txid in made for v in range(len(t.outputs))}
        outputs -= {(i.prev_txid, i.prev_vout) for t in b.txs if t.txid in made for i in t.inputs}
        assert {(u.txid, u.vout) for u in store.iter_utxos(confirmed=False)} == outputs
        assert pipeline.pending() == set()
    finally:
        store.close()
        state.close()


@pytest.mark.timeout(240)
def test_a_burst_spreads_over_the_workers(pipeline: Pipeline) -> None:
    """1,200 txs in one `utxo enqueue tx`: five messages, taken by both workers; in-burst
    parents and children, double spends inside a batch and across batches; `utxo wait` reports
    the refused ones (exit 4) and the store holds what the model allows."""
    b = make_burst(5, 1200, leaf_rivals=True)
    pipeline.seed(b.funds)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    lines = pipeline.enqueue("tx", [t.raw for t in b.txs])
    assert [line["txid"] for line in lines] == [t.txid_hex for t in b.txs]
    out = pipeline.wait(180, refused=None)
    check_burst(pipeline, b)
    store = pipeline.open_utxo()
    try:
        n_refused = len(b.txs) - len(store.existing([t.txid for t in b.txs]))
    finally:
        store.close()
    assert out["refused"] == n_refused >= len(b.rivals) > 50, out
    for name in ("w1", "w2"):  # both took batches (each ends Refused: it held a double spend)
        assert "Task utxoflow.txs.arrived[txs-" in pipeline.log(name), pipeline.log(name)


def big(*outs: tuple[Tx, int], fee: int = 1000) -> Tx:
    """A spend too large to travel with its registration (its bytes go to the blob store): a
    data-carrier output over INLINE_TX_MAX."""
    total = sum(t.outputs[v].satoshis for t, v in outs) - fee
    data = b"\x00\x6a\x4e" + (INLINE_TX_MAX + 1).to_bytes(4, "little") + bytes(INLINE_TX_MAX + 1)
    return build_tx([spend_input(t, v) for t, v in outs], [(total, script()), (0, data)])


def kept_bytes(pipeline: Pipeline, change: str, params: tuple[object, ...] = ()) -> None:
    """Change the state store's kept tx bytes (fault injection: `change` is a statement)."""
    state = pipeline.open_state()
    try:
        state.db.write("test", lambda cur: cur.execute(state.db.q(change), params))  # type: ignore[attr-defined]
    finally:
        state.close()


@pytest.mark.timeout(120)
def test_a_tx_whose_stored_bytes_are_gone_or_bad_is_refused_alone(pipeline: Pipeline) -> None:
    """In a batch of seven (two of them large, so in the blob store), one small tx's bytes are
    gone from the state store, another's are garbage, a large one's blob is gone and another's
    is garbage: those four are refused, each saying so (enqueue it again); the other three are
    accepted; the batch is not retried for ever over them. The bytes travel as the module says:
    the small ones' in the state store only, the large ones' in the blob store only."""
    funds = funding(7)
    pipeline.seed(funds)
    txs = [spend((f, 0)) for f in funds[:5]] + [big((f, 0)) for f in funds[5:]]
    pipeline.enqueue("tx", [t.raw for t in txs])
    blobs = tmp_blobs(pipeline)
    assert [(blobs / blob_key(t.txid, "tx")).is_file() for t in txs] == [False] * 5 + [True] * 2
    state = pipeline.open_state()
    try:
        kept = state.tx_bytes([f"tx:{t.txid_hex}" for t in txs])
    finally:
        state.close()
    assert kept == {f"tx:{t.txid_hex}": t.raw for t in txs[:5]}
    kept_bytes(pipeline, "DELETE FROM tx_bytes WHERE ident = ?", (f"tx:{txs[1].txid_hex}",))
    garbage = (b"not a tx", f"tx:{txs[3].txid_hex}")
    kept_bytes(pipeline, "UPDATE tx_bytes SET raw = ? WHERE ident = ?", garbage)
    (blobs / blob_key(txs[5].txid, "tx")).unlink()
    (blobs / blob_key(txs[6].txid, "tx")).write_bytes(txs[0].raw)  # another tx's bytes
    pipeline.start_worker("w1")
    out = pipeline.wait(60, refused=4)
    reasons = {r["key"]: r["reason"] for r in out["refusals"]}
    assert "kept neither with its registration nor in the blob store" in reasons[txs[1].txid_hex], out
    assert "not a transaction" in reasons[txs[3].txid_hex], out
    assert "kept neither" in reasons[txs[5].txid_hex], out
    assert f"another tx's ({txs[0].txid_hex})" in reasons[txs[6].txid_hex], out
    store = pipeline.open_utxo()
    try:
        assert store.existing([t.txid for t in txs]) == {txs[k].txid for k in (0, 2, 4)}
    finally:
        store.close()


@pytest.mark.timeout(180)
def test_a_blob_store_failing_mid_file_says_how_far_it_got(pipeline: Pipeline) -> None:
    """`utxo enqueue tx` stores the large txs of batches ahead of the one it sends: a blob store
    that fails on the txs of one shard of the third batch ends it with one line naming a blob
    there (exit 2) after the two batches before were sent (their lines printed); nothing of the
    third is registered; the same file enqueued again once the store works sends the rest, and
    all of it is applied."""
    funds = funding(2 * TX_BATCH + 10)
    pipeline.seed(funds)  # (the third batch: ten large txs)
    txs = [spend((f, 0)) for f in funds[:2 * TX_BATCH]] + [big((f, 0)) for f in funds[2 * TX_BATCH:]]

    def shard_of(t: Tx) -> str:
        return blob_key(t.txid, "tx").split("/")[0]

    shard = tmp_blobs(pipeline) / shard_of(txs[-1])  # (the first two batches write no blob)
    shard.parent.mkdir(parents=True, exist_ok=True)
    shard.write_bytes(b"a file where the shard's directory must go")
    path = pipeline.tmp / "burst.hex"
    path.write_text("".join(t.raw.hex() + "\n" for t in txs))
    r = pipeline.utxo("enqueue", "tx", path.name)
    assert r.returncode == 2, r.stderr
    said = r.stderr.strip().splitlines()[-1]
    assert said.startswith(f"utxo: error: [STORAGE_ERROR] blob {shard.name}/"), r.stderr
    assert any(blob_key(t.txid, "tx") in said for t in txs[2 * TX_BATCH:]), said  # (one of the third's)
    sent = [json.loads(line)["txid"] for line in r.stdout.splitlines()]
    assert sent == [t.txid_hex for t in txs[:2 * TX_BATCH]]
    assert pipeline.pending() == {f"tx:{t}" for t in sent}
    shard.unlink()
    pipeline.start_worker("w1")
    assert len(pipeline.enqueue("tx", [t.raw for t in txs])) == len(txs)
    pipeline.wait(120)
    store = pipeline.open_utxo()
    try:
        assert store.existing([t.txid for t in txs]) == {t.txid for t in txs}
    finally:
        store.close()


def tmp_blobs(pipeline: Pipeline) -> Path:
    return Path(pipeline.env["UTXO_BLOB_URL"].removeprefix("file://"))


@pytest.mark.timeout(240)
def test_a_worker_killed_mid_batch_leaves_nothing_lost_or_twice(pipeline: Pipeline) -> None:
    """w1 is killed (SIGKILL) with a batch's inputs spent and none of its records made. The
    registry's re-sending scan sends the batch again (as a batch) to w2, which finishes it:
    every tx once, the model's holders, nothing pending."""
    b = make_burst(9, 240, double_spends=0.05, leaf_rivals=True)
    pipeline.seed(b.funds)
    marker = pipeline.tmp / "parked"
    pipeline.start_worker("w1", env=faults("tx_spent", marker))
    pipeline.enqueue("tx", [t.raw for t in b.txs])
    text = until(lambda: marker.exists() and marker.read_text(), 60, 0.05, "w1 parked after a batch's spends")
    w1 = pipeline.workers[0]
    assert int(text.split()[0]) in children(w1.pid)
    os.killpg(w1.pid, signal.SIGKILL)
    w1.wait()
    pipeline.start_worker("w2", env={"UTXO_REQUEUE_AFTER": "2", "UTXO_REQUEUE_INTERVAL": "1"})
    pipeline.wait(180, refused=None)
    check_burst(pipeline, b)
    assert "re-sent" in pipeline.log("w2"), pipeline.log("w2")


@pytest.mark.timeout(300)
def test_redis_restarted_mid_burst(tmp_path: Path, broker: RedisServer) -> None:
    """A Redis of this test's own, killed (no persistence: its queues are gone) while a worker
    applies the first of a burst's batches and the rest wait on the queue, then started again:
    the registry sends what was lost again, in batches ("lost with an earlier broker run"), a
    second worker joins, and the burst ends as the model allows."""
    pipeline = Pipeline(tmp_path, broker.url)
    try:
        b = make_burst(13, 2000, leaf_rivals=True)
        pipeline.seed(b.funds)
        quick = {"UTXO_REQUEUE_AFTER": "1h", "UTXO_REQUEUE_INTERVAL": "1"}  # re-sent for the lost run
        pipeline.enqueue("tx", [t.raw for t in b.txs])
        assert pipeline.redis.llen("txs") == 8
        pipeline.start_worker("w1", env=quick)
        until(lambda: "utxoflow.txs.arrived[txs-" in pipeline.log("w1"), 60, why="w1 took a batch")
        broker.kill()  # the seven batches still queued are gone, and the one w1 holds unacked
        broker.start()
        pipeline.start_worker("w2", env=quick)
        pipeline.wait(240, refused=None)
        check_burst(pipeline, b)
        assert "lost with an earlier broker run" in pipeline.logs()
    finally:
        pipeline.stop(graceful=False)
