"""`utxo demo`: block 413567 applied to a fresh store from the snapshot of its inputs."""

from __future__ import annotations

from pathlib import Path

from chain import parse_block
from tests.cli.conftest import Run

FEES_413567 = 31_310_238


def check_summary(s: dict[str, object]) -> None:
    assert s["block"] == "0000000000000000025aff8be8a55df8f89c77296db6198f272d6577325d4069"
    assert s["height"] == 413567
    assert s["txs"] == 1557
    assert s["inputs"] == 4886  # every input but the coinbase's
    assert s["fees"] == FEES_413567
    assert isinstance(s["tx_per_s"], float) and s["tx_per_s"] > 0
    assert isinstance(s["utxos"], int) and s["utxos"] > 0


def test_demo_on_its_own_temporary_store(run: Run, data_dir: Path) -> None:
    r = run("demo", "--data", str(data_dir))
    assert r.code == 0, r.err
    s = r.json()
    check_summary(s)
    assert str(s["store"]).startswith("sqlite:///")


def test_demo_on_a_given_store_then_query_it(run: Run, store_url: str, data_dir: Path) -> None:
    r = run("--store-url", store_url, "demo", env={"UTXOFLOW_DATA": str(data_dir)})
    assert r.code == 0, r.err
    s = r.json()
    check_summary(s)
    stats = run("--store-url", store_url, "stats").json()
    assert (stats["utxos"], stats["satoshis"], stats["height"]) == (s["utxos"], s["satoshis"], 413567)

    coinbase = parse_block((data_dir / "mainnet-413567.block").read_bytes()).txs[0]
    meta = run("--store-url", store_url, "tx", coinbase.txid_hex).json()
    assert meta["is_coinbase"] is True and meta["block_heights"] == [413567]
    assert meta["hex"] == coinbase.raw.hex()

    r = run("demo", "--store-url", store_url, "--data", str(data_dir))
    assert r.code == 2 and len(r.err_lines) == 1 and "not empty" in r.err, r.err


def test_demo_without_data_exits_2(run: Run, tmp_path: Path) -> None:
    r = run("demo", "--data", str(tmp_path))
    assert r.code == 2 and len(r.err_lines) == 1 and "demo data not found" in r.err, r.err
