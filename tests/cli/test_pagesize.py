"""A store made with another UTXO_BATCH_SIZE (the demo's holds 1,000 outputs per record) is read
without setting it by hand: the store's own page size is used, and the differing setting is one
warning line on stderr (stores/utxo/pagesize.py), on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import PREVOUTS, SNAPSHOT_HEIGHT, run_utxo


def test_a_store_of_another_batch_size_is_read_with_a_warning(
    store_url: str, tmp_path: Path, data_dir: Path, snapshot_block_hash: str
) -> None:
    def utxo(*args: str) -> tuple[int, str, list[str]]:
        r = run_utxo("--store-url", store_url, *args, cwd=tmp_path)
        return r.code, r.out, r.err_lines

    code, _out, err = utxo("--batch-size", "1000", "import-utxos", str(data_dir / PREVOUTS),
                           "--height", str(SNAPSHOT_HEIGHT), "--block-hash", snapshot_block_hash)
    assert code == 0, err
    for command in (["stats"], ["utxos", "--confirmed"]):
        code, same, err = utxo("--batch-size", "1000", *command)
        assert code == 0 and err == [], err
        code, out, err = utxo(*command)  # the default, 20000
        assert code == 0 and out == same, err
        (warning,) = err
        assert warning.startswith("utxo: warning: ") and "UTXO_BATCH_SIZE=1000" in warning, warning
        assert "20000" in warning and "[STORAGE_ERROR]" not in warning
