"""`utxo export-utxos`, and `utxo import-utxos` of what it writes, as real processes over real
stores: chains applied through the sequencer (the demo's generated chain — a snapshot base, a
transaction spanning three records, a reorg — on SQLite and PostgreSQL; mainnet blocks 1–255 on
SQLite), exported, held to the tip's commitment and to a MuHash computed here one coin at a
time, imported into fresh stores, and tampered with."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from chain import hash_to_hex, hex_to_hash, iter_blk_records, parse_block
from chain.muhash import MuHash, coin_bytes
from stores.blob import open_blob_store
from stores.state import BlockStatus, Commitment, open_state_store
from stores.utxo import open_utxo_store
from tests.cli.conftest import ROOT, PgServer, Result, run_utxo, utxo_command
from tests.pipeline.chains import commitment_model
from workers.chainstate.commitment import muhash_hex
from workers.chainstate.sequencer import Sequencer
from workers.demo.demochain import SNAPSHOT_HASH, SNAPSHOT_HEIGHT, DemoChain, generate

BATCH = 1000  # outputs per record: the demo chain's big transaction spans three
MOVED = "the chain moved while exporting"
Model = tuple[str, int, int]  # (MuHash as Core prints it, outputs, satoshis)


@dataclass
class Stores:
    """A UTXO store and a state store (new, or holding a chain), and `utxo` run against them."""

    cwd: Path
    store_url: str
    state_url: str

    @property
    def opts(self) -> list[str]:
        return ["--store-url", self.store_url, "--state-url", self.state_url,
                "--blob-url", f"file://{self.cwd}/blobs", "--batch-size", str(BATCH)]

    def run(self, *args: str, stdin: str | None = None) -> Result:
        return run_utxo(*self.opts, *args, cwd=self.cwd, stdin=stdin)

    @classmethod
    def sqlite(cls, where: Path) -> Stores:
        where.mkdir(exist_ok=True)
        return cls(where, f"sqlite:///{where}/utxo.db", f"sqlite:///{where}/state.db")

    def sequencer(self) -> Sequencer:
        blobs = f"file://{self.cwd}/blobs"
        utxo = open_utxo_store(self.store_url, blob_url=blobs, batch_size=BATCH)
        return Sequencer(utxo, open_state_store(self.state_url), open_blob_store(blobs))

    def is_empty(self) -> bool:
        """Whether the UTXO store holds nothing: no outputs, no height (`utxo stats`)."""
        r = self.run("stats")
        assert r.code == 0, r.err
        return bool(r.json()["utxos"] == 0 and r.json()["height"] == 0)


@dataclass
class Chain:
    stores: Stores
    tip_hash: str
    tip_height: int
    model: Model  # the chain's confirmed set, computed from its blocks here


NewStores = Callable[[str], Stores]


@pytest.fixture(scope="module")
def new_stores(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> NewStores:
    """`new_stores(name)`: empty stores of the backend: SQLite files in a new directory, or a new
    schema of the session's PostgreSQL database holding both (their tables do not collide)."""

    def make(name: str) -> Stores:
        cwd = tmp_path_factory.mktemp(f"{name}-{backend}")
        if backend == "sqlite":
            return Stores.sqlite(cwd)
        pg: PgServer = request.getfixturevalue("pg")
        url = pg.new_store_url()
        return Stores(cwd, url, url)

    return make


@cache
def demo() -> DemoChain:
    return generate(5, 8, BATCH)


def apply_demo(stores: Stores, blocks: list[bytes]) -> None:
    """The demo's snapshot, then `blocks`, through a sequencer in this process."""
    seq = stores.sequencer()
    try:
        seq.utxo.import_utxos(demo().snapshot, height=SNAPSHOT_HEIGHT, block_hash=SNAPSHOT_HASH)
        for raw in blocks:
            seq.submit(raw)
    finally:
        seq.utxo.close()
        seq.state.close()


@pytest.fixture(scope="module")
def demo_chain(new_stores: NewStores) -> Chain:
    """The demo's chain, its heavier branch applied last (the reorg): read only."""
    d = demo()
    stores = new_stores("demo")
    apply_demo(stores, d.main + d.side)
    model = commitment_model(d.best, SNAPSHOT_HEIGHT + 1, d.snapshot)
    return Chain(stores, hash_to_hex(d.tip_hash), d.tip_height, model)


@dataclass
class Exported:
    path: Path
    result: Result
    lines: list[str]  # the file's, header first, with their newlines

    @property
    def header(self) -> dict[str, Any]:
        snap: dict[str, Any] = json.loads(self.lines[0])["snapshot"]
        return snap


def export(stores: Stores, name: str = "set.jsonl") -> Exported:
    path = stores.cwd / name
    r = stores.run("export-utxos", str(path))
    assert r.code == 0, r.err
    return Exported(path, r, path.read_text().splitlines(keepends=True))


@pytest.fixture(scope="module")
def exported(demo_chain: Chain) -> Exported:
    return export(demo_chain.stores)


def muhash_of(lines: list[str]) -> Model:
    """The set the JSON lines list, hashed here with the primitive's plain `insert`."""
    h, n, sats = MuHash(), 0, 0
    for line in lines:
        u = json.loads(line)
        txid, script = hex_to_hash(u["txid"]), bytes.fromhex(u["script"])
        h.insert(coin_bytes(txid, u["vout"], u["height"], u["coinbase"], u["satoshis"], script))
        n, sats = n + 1, sats + u["satoshis"]
    return h.hex(), n, sats


def as_model(header: dict[str, Any]) -> Model:
    return header["muhash"], header["utxos"], header["satoshis"]


def flags(header: dict[str, Any]) -> list[str]:
    """The import's options naming the header's block."""
    return ["--height", str(header["height"]), "--block-hash", header["block_hash"]]


def one_error(r: Result, code: int = 2) -> str:
    assert r.code == code, (r.code, r.err)
    assert len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    return r.err


# -- export ------------------------------------------------------------------------------------
def test_the_header_is_the_tips_commitment(demo_chain: Chain, exported: Exported) -> None:
    run = demo_chain.stores.run
    head = exported.header
    assert (head["height"], head["block_hash"]) == (demo_chain.tip_height, demo_chain.tip_hash)
    assert run("tip").json() == {"height": demo_chain.tip_height, "hash": demo_chain.tip_hash}
    stats = run("stats", "--hash", "muhash").json()
    block = run("block", demo_chain.tip_hash).json()
    for kept in (stats, block):
        assert as_model(head) == (kept["muhash"], kept["utxos"], kept["satoshis"])
    assert as_model(head) == demo_chain.model  # the chain's own set, hashed here
    assert exported.result.json() == {"file": str(exported.path), **head}


def test_the_lines_are_the_confirmed_set_as_import_lines(demo_chain: Chain, exported: Exported) -> None:
    listing = demo_chain.stores.run("utxos", "--confirmed")
    assert listing.code == 0, listing.err
    body = exported.lines[1:]
    assert len(body) == exported.header["utxos"] > 2 * BATCH  # the big transaction is in it
    assert sorted(body) == sorted(listing.out.splitlines(keepends=True))
    assert muhash_of(body) == muhash_of(listing.out.splitlines()) == as_model(exported.header)
    assert all(set(json.loads(line)) == {"txid", "vout", "satoshis", "script", "height", "coinbase"}
               for line in body)


def test_to_stdout_the_same_and_no_summary(demo_chain: Chain, exported: Exported) -> None:
    r = demo_chain.stores.run("export-utxos", "-")
    assert r.code == 0, r.err
    assert r.out == "".join(exported.lines)


def export_to_pipe(stores: Stores) -> subprocess.Popen[str]:
    """`utxo export-utxos -` started, its stdout and stderr pipes for the test to read (or not)."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("UTXO_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen([*utxo_command(), *stores.opts, "export-utxos", "-"], cwd=stores.cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_reader_that_goes_away_ends_it_quietly(demo_chain: Chain) -> None:
    p = export_to_pipe(demo_chain.stores)
    assert p.stdout is not None and p.stderr is not None
    assert '"snapshot"' in p.stdout.readline()
    p.stdout.close()  # as `| head -1` does, long before the end (the set is some 400 kB)
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0 and "error" not in err, err


# -- import of an export -----------------------------------------------------------------------
def test_import_without_flags_gives_the_same_set(exported: Exported, new_stores: NewStores) -> None:
    target = new_stores("target")
    head = exported.header
    r = target.run("import-utxos", str(exported.path))
    assert r.code == 0, r.err
    assert r.json() == {
        "imported": head["utxos"], "skipped": 0, "data_carriers": 0, "height": head["height"],
        "block_hash": head["block_hash"], "muhash": head["muhash"],
    }
    listing = target.run("utxos", "--confirmed")
    assert listing.code == 0, listing.err
    assert muhash_of(listing.out.splitlines()) == as_model(head)
    stats = target.run("stats").json()
    keys = ("utxos", "satoshis", "height")
    assert [stats[k] for k in keys] == [head[k] for k in keys]


def test_import_from_stdin_with_flags_that_agree(exported: Exported, new_stores: NewStores) -> None:
    target = new_stores("stdin")
    head = exported.header
    r = target.run("import-utxos", "-", "--height", str(head["height"]),
                   "--block-hash", head["block_hash"].upper(), stdin="".join(exported.lines))
    assert r.code == 0, r.err
    assert (r.json()["imported"], r.json()["muhash"]) == (head["utxos"], head["muhash"])


def set_header(lines: list[str], **changes: Any) -> list[str]:
    head = json.loads(lines[0])
    head["snapshot"].update(changes)
    return [json.dumps(head) + "\n", *lines[1:]]


def change_line(lines: list[str], k: int, **changes: Any) -> list[str]:
    entry = json.loads(lines[k])
    entry.update(changes)
    return [*lines[:k], json.dumps(entry) + "\n", *lines[k + 1 :]]


def tampered(kind: str, lines: list[str]) -> tuple[list[str], list[str]]:
    """The file's lines tampered with as `kind` says, and what the refusal must name."""
    head = json.loads(lines[0])["snapshot"]
    n, sats, muhash = head["utxos"], head["satoshis"], head["muhash"]
    k = len(lines) // 2
    entry = json.loads(lines[k])
    if kind == "one satoshi more":
        return change_line(lines, k, satoshis=entry["satoshis"] + 1), [
            f"satoshis {sats + 1} found, {sats} expected", f"{muhash} expected"]
    if kind == "a line dropped":
        return [*lines[:k], *lines[k + 1 :]], [
            f"utxos {n - 1} found, {n} expected", f"satoshis {sats - entry['satoshis']} found",
            f"{muhash} expected"]
    if kind == "a script changed":  # the counts hold: the MuHash alone tells
        script = entry["script"][:-2] + ("00" if entry["script"][-2:] != "00" else "01")
        return change_line(lines, k, script=script), [f"{muhash} expected"]
    if kind == "the header's muhash changed":
        return set_header(lines, muhash="ab" * 32), [f"muhash {muhash} found, {'ab' * 32} expected"]
    assert kind == "the header's count changed"
    return set_header(lines, utxos=n + 1), [f"utxos {n} found, {n + 1} expected"]


@pytest.mark.parametrize("kind", [
    "one satoshi more", "a line dropped", "a script changed", "the header's muhash changed",
    "the header's count changed",
])
def test_a_tampered_file_imports_nothing(kind: str, exported: Exported, new_stores: NewStores) -> None:
    target = new_stores("tampered")
    lines, named = tampered(kind, exported.lines)
    path = target.cwd / "tampered.jsonl"
    path.write_text("".join(lines))
    err = one_error(target.run("import-utxos", str(path)))
    assert "do not match the snapshot header" in err and "nothing was imported" in err, err
    for words in named:
        assert words in err, (words, err)
    if kind in ("a script changed", "the header's muhash changed"):
        assert "utxos" not in err and "satoshis" not in err, err
    assert target.is_empty()


def test_flags_that_disagree_with_the_header_exit_2(exported: Exported, new_stores: NewStores) -> None:
    target = new_stores("flags")
    head = exported.header
    f = str(exported.path)
    for args, words in (
        (["--height", str(head["height"] + 1)], f"--height {head['height'] + 1} disagrees"),
        (["--block-hash", "00" * 32], f"block_hash {head['block_hash']}"),
        (["--height", str(head["height"]), "--block-hash", "00" * 32], "--block-hash"),
    ):
        err = one_error(target.run("import-utxos", f, *args))
        assert words in err, (args, err)
    # refused before a store was opened: none was made
    assert "no UTXO store" in one_error(target.run("stats"))


def test_a_file_without_a_header_still_needs_the_flags(exported: Exported, new_stores: NewStores) -> None:
    target = new_stores("headerless")
    head = exported.header
    path = target.cwd / "bare.jsonl"
    path.write_text("".join(exported.lines[1:]))
    for args in ([], ["--height", str(head["height"])]):
        err = one_error(target.run("import-utxos", str(path), *args))
        assert "--block-hash" in err and "no snapshot header" in err, err
    r = target.run("import-utxos", str(path), *flags(head))
    assert r.code == 0, r.err
    assert r.json() == {  # nothing to verify: the muhash is what the entries give (the same)
        "imported": head["utxos"], "skipped": 0, "data_carriers": 0, "height": head["height"],
        "block_hash": head["block_hash"], "muhash": head["muhash"],
    }
    # and the snapshot's block has its commitment, for the first block applied on it
    state = open_state_store(target.state_url)
    try:
        kept = state.get_commitment(hex_to_hash(head["block_hash"]))
    finally:
        state.close()
    assert kept is not None and (muhash_hex(kept), kept.utxos, kept.satoshis) == (
        head["muhash"], head["utxos"], head["satoshis"])


def test_malformed_or_misplaced_headers_exit_2(exported: Exported, new_stores: NewStores) -> None:
    target = new_stores("badheader")
    head = json.loads(exported.lines[0])
    body = exported.lines[1:]
    no_muhash = {"snapshot": {k: v for k, v in head["snapshot"].items() if k != "muhash"}}
    for first, words in (
        (no_muhash, "line 1: 'snapshot' is missing 'muhash'"),
        ({"snapshot": {**head["snapshot"], "muhash": "xyz"}}, "line 1: 'muhash' must be 64 hex digits"),
        ({"snapshot": {**head["snapshot"], "chain": "main"}}, "line 1: 'snapshot' holds unknown 'chain'"),
        ({**head, "txid": "00" * 32}, "line 1: a snapshot header holds 'snapshot' only"),
        ({"snapshot": {**head["snapshot"], "height": 0}}, "line 1: 'height' must be in 1.."),
    ):
        path = target.cwd / "bad.jsonl"
        path.write_text(json.dumps(first) + "\n" + "".join(body))
        assert words in one_error(target.run("import-utxos", str(path))), words
    # a header anywhere but on the first line is a bad entry
    path.write_text("".join([body[0], exported.lines[0], *body[1:]]))
    err = one_error(target.run("import-utxos", str(path), *flags(exported.header)))
    assert "line 2: a snapshot header belongs on the first line only" in err, err
    assert target.is_empty()


# -- export refused ----------------------------------------------------------------------------
def test_export_without_a_chain_exits_1(tmp_path: Path) -> None:
    stores = Stores.sqlite(tmp_path)
    open_state_store(stores.state_url).close()  # a state store where no block was applied
    err = one_error(stores.run("export-utxos", str(tmp_path / "set.jsonl")), code=1)
    assert "no block has been applied" in err, err
    assert not (tmp_path / "set.jsonl").exists()


def test_export_of_a_tip_without_a_commitment_exits_2(tmp_path: Path) -> None:
    """A chain applied before commitments were kept: nothing to hold the export to."""
    stores = Stores.sqlite(tmp_path)
    state = open_state_store(stores.state_url)
    try:
        state.add_block(b"\x11" * 32, b"\x00" * 32, 7, 0, BlockStatus.APPLIED, 1)
        state.commit(tip=b"\x11" * 32)
    finally:
        state.close()
    err = one_error(stores.run("export-utxos", str(tmp_path / "set.jsonl")))
    assert f"the tip {'11' * 32} has no commitment" in err, err
    assert not (tmp_path / "set.jsonl").exists()


@pytest.fixture
def mainnet_raws(data_dir: Path) -> list[bytes]:
    return [raw for _off, raw in iter_blk_records((data_dir / "mainnet-1-255.blk").read_bytes())]


def apply_raws(stores: Stores, raws: list[bytes]) -> None:
    seq = stores.sequencer()
    try:
        for raw in raws:
            e = seq.submit(raw)
            assert e.status is BlockStatus.APPLIED, e
    finally:
        seq.utxo.close()
        seq.state.close()


def test_a_set_unlike_the_kept_commitment_fails_and_leaves_no_file(
    tmp_path: Path, mainnet_raws: list[bytes]
) -> None:
    stores = Stores.sqlite(tmp_path)
    apply_raws(stores, mainnet_raws[:20])
    tip = parse_block(mainnet_raws[19]).hash
    state = open_state_store(stores.state_url)
    try:  # the kept commitment says one coin more than the store holds
        kept = state.get_commitment(tip)
        assert kept is not None
        wrong = MuHash.from_bytes(kept.muhash)
        wrong.insert(b"a coin the store does not hold")
        state.commit(commitments={tip: Commitment(wrong.to_bytes(), kept.utxos + 1, kept.satoshis)})
    finally:
        state.close()
    out = tmp_path / "out"
    out.mkdir()
    old = out / "set.jsonl"
    old.write_text("an earlier export\n")
    err = one_error(stores.run("export-utxos", str(old)))
    assert f"muhash {MuHash.from_bytes(kept.muhash).hex()} (20 outputs" in err, err
    assert f"written, {wrong.hex()} (21 outputs" in err, err
    assert old.read_text() == "an earlier export\n" and [p.name for p in out.iterdir()] == ["set.jsonl"]
    # to stdout the lines are out already: the exit status says to throw them away
    r = stores.run("export-utxos", "-")
    assert r.code == 2 and len(r.err_lines) == 1 and wrong.hex() in r.err, r.err
    assert json.loads(r.out.splitlines()[0])["snapshot"]["muhash"] == wrong.hex()


def test_the_chain_moving_while_exporting_fails(tmp_path: Path) -> None:
    """The reorg's last block is applied while an export to a pipe waits for its reader."""
    d = demo()
    stores = Stores.sqlite(tmp_path)
    apply_demo(stores, d.main + d.side[:-1])
    p = export_to_pipe(stores)
    try:
        assert p.stdout is not None
        # Under way, and soon waiting on the full pipe: the set is some 400 kB of lines.
        first = p.stdout.readline()
        assert json.loads(first)["snapshot"]["height"] == d.tip_height - 1
        seq = stores.sequencer()
        try:
            assert seq.submit(d.side[-1]).hash == d.tip_hash
        finally:
            seq.utxo.close()
            seq.state.close()
        rest, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2 and err.splitlines() == [f"utxo: error: {MOVED}: stop the workers or wait, "
                                                      "then export again"], err
    assert len(rest.splitlines()) > 2 * BATCH  # it wrote on, and only then found out
    again = export(stores)  # the chain standing still, the export goes through
    assert (again.header["height"], again.header["block_hash"]) == (d.tip_height, hash_to_hex(d.tip_hash))


# -- mainnet -----------------------------------------------------------------------------------
def test_mainnet_blocks_1_to_255_round_trip(tmp_path: Path, mainnet_raws: list[bytes]) -> None:
    source = Stores.sqlite(tmp_path / "chain")
    apply_raws(source, mainnet_raws)
    blocks = [parse_block(raw) for raw in mainnet_raws]
    model = commitment_model([b.txs for b in blocks], 1)
    ex = export(source)
    assert (ex.header["height"], ex.header["block_hash"]) == (255, blocks[-1].hash_hex)
    assert as_model(ex.header) == model == muhash_of(ex.lines[1:])
    stats = source.run("stats", "--hash", "muhash").json()
    assert (stats["muhash"], stats["utxos"], stats["satoshis"]) == model
    copy = Stores.sqlite(tmp_path / "copy")
    r = copy.run("import-utxos", str(ex.path))
    assert r.code == 0, r.err
    assert (r.json()["imported"], r.json()["muhash"]) == (ex.header["utxos"], ex.header["muhash"])
    listing = copy.run("utxos", "--confirmed")
    assert muhash_of(listing.out.splitlines()) == model
    # entry for entry, heights and coinbase flags too, what the chain's store lists
    assert sorted(listing.out.splitlines()) == sorted(source.run("utxos", "--confirmed").out.splitlines())


