"""`utxo config`: the effective settings, from defaults, the environment, `.env` and flags."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Run

CONTRACT_DEFAULTS = {
    "store_url": "sqlite:///./data/utxo.db",
    "blob_url": "file://./data/blobs",
    "state_url": "sqlite:///./data/state.db",
    "broker_url": "redis://127.0.0.1:6379/0",
    "batch_size": 20000,
    "max_tx_size_in_store": 1048576,
    "externalize_all": False,
    "external_cache_mb": 64,
    "block_height_retention": 288,
    "allow_missing_inputs": False,
    "flower_address": "127.0.0.1",
    "flower_basic_auth": "",
    "metrics_port": 0,  # operations (docs/operations.md)
    "metrics_address": "0.0.0.0",
    "log_json": False,
    "requeue_after": 300,  # re-sending lost messages (README settings)
    "requeue_interval": 10,
    "block_chunk_txs": 1000,  # units of a block phase (README settings)
    "block_chunk_helpers": None,  # by store: 0 on SQLite, else 4
    "block_task_budget": 5,  # a block task hands the chain on after this long (README settings)
    "store_wait": 60,  # a starting worker waits this long for an unreachable store (README settings)
}
SEED_DEFAULTS = {
    "pruner_job_timeout": 600,
    "pruner_chunk_size": 1000,
    "pruner_chunk_group_limit": 10,
    "pruner_progress_log_interval": 30,
    "pruner_defensive_enabled": False,
    "pruner_defensive_batch_read_size": 10000,
    "unmined_tx_retention": 144,
    "parent_preservation_blocks": 14400,
    "disable_dah_cleaner": False,
    "recovery_ttl": 30,
    "recovery_scan_interval": 5,
    "recovery_batch_size": 100,
    "recovery_workers": 4,
    "recovery_lease": 30,
    "recovery_not_found_grace": 1800,
    "recovery_enabled": True,
    "recovery_advisory_lock_id": 8389190333894887286,
    "recovery_instance_id": "",
    "lock_base_ttl": 30,
    "lock_per_record_ttl": 2,
    "lock_max_ttl": 300,
}


def test_config_prints_the_defaults(run: Run) -> None:
    r = run("config")
    assert r.code == 0, r.err
    cfg = r.json()
    assert cfg == {**CONTRACT_DEFAULTS, **SEED_DEFAULTS}


def test_environment_beats_dotenv_and_flags_beat_both(run: Run, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "UTXO_BATCH_SIZE=7\n"
        "UTXO_BLOCK_HEIGHT_RETENTION=100\n"
        "UTXO_STORE_URL=postgresql://alice:s3cret@db.example:5432/utxo\n"
        "UTXO_PRUNER_JOB_TIMEOUT=2m\n"
    )
    cfg = run("config").json()
    assert cfg["batch_size"] == 7
    assert cfg["block_height_retention"] == 100
    assert cfg["unmined_tx_retention"] == 50  # half the retention unless set
    assert cfg["pruner_job_timeout"] == 120
    assert cfg["store_url"] == "postgresql://alice:***@db.example:5432/utxo"

    env = {"UTXO_BATCH_SIZE": "9", "UTXO_EXTERNALIZE_ALL": "true", "UTXO_UNMINED_TX_RETENTION": "10"}
    r = run("config", env={**env, "UTXO_BACTH_SIZE": "3"})
    cfg = r.json()
    assert (cfg["batch_size"], cfg["externalize_all"], cfg["unmined_tx_retention"]) == (9, True, 10)
    assert "UTXO_BACTH_SIZE is not a setting" in r.err  # a typo is reported, not silently ignored

    r = run("--batch-size", "11", "--retention", "20", "--store-url", "sqlite:///x.db", "config", env=env)
    cfg = r.json()
    assert (cfg["batch_size"], cfg["block_height_retention"], cfg["store_url"]) == (11, 20, "sqlite:///x.db")
    # 0 is a retention too: records are never pruned (README settings)
    cfg = run("--retention", "0", "config", env=env).json()
    assert (cfg["block_height_retention"], cfg["unmined_tx_retention"]) == (0, 10)
    r = run("--retention", "-1", "config")
    assert r.code == 2 and len(r.err_lines) == 1 and "--retention" in r.err


def test_help_names_every_exit_code(run: Run) -> None:
    r = run("--help")
    assert r.code == 0
    text = " ".join(r.out.split())
    for code in ("0 ok", "1 not found", "2 bad input", "3 internal error"):
        assert code in text, text


def test_bad_values_exit_2_with_one_line_naming_the_variable(run: Run) -> None:
    for name, value in [
        ("UTXO_BATCH_SIZE", "0"),
        ("UTXO_EXTERNALIZE_ALL", "perhaps"),
    ]:
        r = run("config", env={name: value})
        assert r.code == 2, (name, r.err)
        assert r.out == ""
        assert len(r.err_lines) == 1 and name in r.err and "Traceback" not in r.err, r.err

    r = run("--batch-size", "0", "config")
    assert r.code == 2 and len(r.err_lines) == 1 and "--batch-size" in r.err


def test_usage_errors_are_one_line(run: Run) -> None:
    for args in (["no-such-command"], ["tx"]):
        r = run(*args)
        assert r.code == 2, args
        assert len(r.err_lines) == 1 and r.err.startswith("utxo: error:"), (args, r.err)
