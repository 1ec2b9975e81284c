"""The store commands against SQLite and PostgreSQL: import-utxos of the real snapshot, then
stats, outpoint, tx and utxos read it back; bad input exits 2 with one line and writes nothing."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from chain import hex_to_hash, is_data_carrier, utxo_hash
from chain.muhash import MuHash, coin_bytes
from tests.cli.conftest import PREVOUTS, SNAPSHOT_HEIGHT, Imported, Run

Entry = dict[str, Any]
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def p2pkh_address(script_hex: str) -> str:
    """The mainnet address of a P2PKH script, encoded here (not with chain.address)."""
    assert script_hex.startswith("76a914") and script_hex.endswith("88ac") and len(script_hex) == 50
    payload = b"\x00" + bytes.fromhex(script_hex[6:46])
    data = payload + hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def key(e: Entry) -> tuple[str, int]:
    return e["txid"], e["vout"]


def as_listed(e: Entry) -> Entry:
    """A file entry as `utxo utxos` shows it."""
    return {
        "txid": e["txid"], "vout": e["vout"], "satoshis": e["value"], "script": e["script"],
        "height": e["height"], "coinbase": e["coinbase"],
    }


def test_import_counts(imported: Imported, prevouts: list[Entry], snapshot: list[Entry]) -> None:
    out = imported.result.json()
    assert len(prevouts) == 4886
    assert out["skipped"] == 287 == len(prevouts) - len(snapshot)
    carriers = sum(is_data_carrier(e["value"], bytes.fromhex(e["script"])) for e in snapshot)
    assert out["imported"] == len(snapshot) - carriers == 4599
    assert out["height"] == SNAPSHOT_HEIGHT


def test_stats_match_the_file(imported: Imported, snapshot: list[Entry]) -> None:
    r = imported.run("stats")
    assert r.code == 0, r.err
    assert r.json() == {
        "utxos": len(snapshot),
        "satoshis": sum(e["value"] for e in snapshot),
        "txs": len({e["txid"] for e in snapshot}),
        "height": SNAPSHOT_HEIGHT,
    }


def test_outpoint_of_an_imported_output(imported: Imported, snapshot: list[Entry]) -> None:
    widest = max(snapshot, key=lambda e: e["vout"])  # a multi-byte VarInt in the utxo hash
    for e in (widest, next(x for x in snapshot if x["coinbase"])):
        r = imported.run("outpoint", f"{e['txid']}:{e['vout']}")
        assert r.code == 0, r.err
        h = utxo_hash(hex_to_hash(e["txid"]), e["vout"], bytes.fromhex(e["script"]), e["value"])
        out = r.json()
        assert out["state"] == "unspent"
        assert out["utxo_hash"] == h[::-1].hex()
        assert "spending_txid" not in out
        assert (out["satoshis"], out["script"]) == (e["value"], e["script"])
        assert (out["height"], out["coinbase"]) == (e["height"], e["coinbase"])


def test_outpoint_missing_exits_1(imported: Imported, snapshot: list[Entry], prevouts: list[Entry]) -> None:
    stored = {key(e) for e in snapshot}
    absent_vout = next(v for v in range(1000) if (snapshot[0]["txid"], v) not in stored)
    late = next(e for e in prevouts if e["height"] > SNAPSHOT_HEIGHT)  # skipped on import
    for op in (f"{snapshot[0]['txid']}:{absent_vout}", f"{late['txid']}:{late['vout']}"):
        r = imported.run("outpoint", op)
        assert r.code == 1, (op, r.err)
        assert r.json() == {"state": "missing"}
        assert len(r.err_lines) == 1


def test_outpoint_malformed_exits_2(run: Run) -> None:
    for arg in ("ab" * 32, f"{'zz' * 32}:1", f"{'ab' * 32}:4294967296", f"{'ab' * 32}:\u0660",
                f"{'ab' * 32}:-1", f"{'ab' * 32}:"):
        r = run("outpoint", arg)
        assert r.code == 2, arg
        assert r.out == "" and len(r.err_lines) == 1 and "OUTPOINT" in r.err, (arg, r.err)


def test_tx_of_an_imported_txid(imported: Imported, snapshot: list[Entry]) -> None:
    counts = Counter(e["txid"] for e in snapshot)
    txid, n = counts.most_common(1)[0]
    e = next(x for x in snapshot if x["txid"] == txid)
    r = imported.run("tx", txid)
    assert r.code == 0, r.err
    meta = r.json()
    assert meta["txid"] == txid
    assert meta["block_heights"] == [e["height"]]
    assert meta["total_utxos"] == n and meta["spent_utxos"] == 0
    assert meta["is_coinbase"] is e["coinbase"]
    assert meta["unmined_since"] is None and meta["conflicting"] is False
    assert "hex" not in meta  # a snapshot carries no raw transactions


def test_tx_unknown_exits_1(imported: Imported) -> None:
    r = imported.run("tx", "ab" * 32)
    assert r.code == 1 and r.out == "" and len(r.err_lines) == 1 and "ab" * 32 in r.err


def test_tx_bad_txid_exits_2(run: Run) -> None:
    r = run("tx", "nothex")
    assert r.code == 2 and r.out == ""
    assert len(r.err_lines) == 1 and "TXID" in r.err and "Traceback" not in r.err


def by_index(lines: list[Entry]) -> list[Entry]:
    """Lines of the script index as plain listing lines: every one confirmed (a snapshot's outputs
    are), and each with a cursor."""
    assert all(x.pop("confirmed") is True and isinstance(x.pop("cursor"), str) for x in lines)
    return lines


def test_utxos_by_script(imported: Imported, snapshot: list[Entry]) -> None:
    script, n = Counter(e["script"] for e in snapshot).most_common(1)[0]
    assert n > 1
    r = imported.run("utxos", "--confirmed", "--script", script)
    assert r.code == 0, r.err
    got = sorted(by_index(r.lines()), key=key)
    assert got == sorted((as_listed(e) for e in snapshot if e["script"] == script), key=key)
    sh = hashlib.sha256(bytes.fromhex(script)).digest()[::-1].hex()  # Electrum's scripthash
    again = imported.run("utxos", "--scripthash", sh)
    assert again.code == 0 and sorted(by_index(again.lines()), key=key) == got


def test_utxos_by_address(imported: Imported, snapshot: list[Entry]) -> None:
    p2pkh = Counter(e["script"] for e in snapshot if e["script"][:6] == "76a914" and len(e["script"]) == 50)
    script = p2pkh.most_common(1)[0][0]
    r = imported.run("utxos", "--address", p2pkh_address(script))
    assert r.code == 0, r.err
    expected = [as_listed(e) for e in snapshot if e["script"] == script]
    assert len(expected) > 1 and sorted(by_index(r.lines()), key=key) == sorted(expected, key=key)


def test_an_address_that_owns_nothing_gets_the_p2pk_hint(imported: Imported, snapshot: list[Entry]) -> None:
    """P2PK outputs (early coinbases) pay a key, not an address: an --address that finds nothing
    says how to find them (stderr), for the listing and the balance alike; one that owns outputs
    gets no hint."""
    nobody = hashlib.sha256(b"utxoflow: an address nothing pays").digest()[:20]
    address = p2pkh_address("76a914" + nobody.hex() + "88ac")
    assert all(e["script"] != "76a914" + nobody.hex() + "88ac" for e in snapshot)
    listed = imported.run("utxos", "--address", address)
    assert listed.code == 0 and listed.out == "", listed.err
    assert "--script 41<65-byte key>ac" in listed.err
    balance = imported.run("balance", "--address", address)
    assert balance.code == 0 and balance.json() == {"confirmed": 0, "unconfirmed": 0, "utxos": 0}
    assert "--script 41<65-byte key>ac" in balance.err
    p2pkh = next(e["script"] for e in snapshot if e["script"][:6] == "76a914" and len(e["script"]) == 50)
    owned = imported.run("balance", "--address", p2pkh_address(p2pkh))
    assert owned.code == 0 and owned.json()["utxos"] >= 1 and "P2PK" not in owned.err


def test_a_scripts_outputs_page_by_cursor_and_balance(imported: Imported, snapshot: list[Entry]) -> None:
    script, n = Counter(e["script"] for e in snapshot).most_common(1)[0]
    whole = imported.run("utxos", "--script", script).lines()
    pages: list[Entry] = []
    after: list[str] = []
    for _ in range(n + 1):
        r = imported.run("utxos", "--script", script, "--limit", "2", *after)
        assert r.code == 0, r.err
        lines = r.lines()
        pages += lines
        if len(lines) < 2:
            break
        after = ["--after", lines[-1]["cursor"]]
    assert pages == whole and len(whole) == n  # the same order, nothing twice, nothing missed
    mine = [e for e in snapshot if e["script"] == script]
    b = imported.run("balance", "--script", script)
    assert b.code == 0 and b.json() == {
        "confirmed": sum(e["value"] for e in mine), "unconfirmed": 0, "utxos": len(mine)}
    nobody = imported.run("balance", "--script", "51")
    assert nobody.json() == {"confirmed": 0, "unconfirmed": 0, "utxos": 0}
    for cmd, what in ((["utxos", "--limit", "2"], "--limit and --after"), (["balance"], "give one of"),
                      (["utxos", "--script", script, "--after", "x.y"], "--after")):
        r = imported.run(*cmd)
        assert r.code == 2 and len(r.err_lines) == 1 and what in r.err, (cmd, r.err)


def test_utxos_lists_the_whole_snapshot(imported: Imported, snapshot: list[Entry]) -> None:
    r = imported.run("utxos", "--confirmed")
    assert r.code == 0, r.err
    got = r.lines()
    assert len(got) == len(snapshot)
    assert sorted(got, key=key) == sorted((as_listed(e) for e in snapshot), key=key)


def test_utxos_bad_filters_exit_2(run: Run, snapshot: list[Entry]) -> None:
    good = p2pkh_address(next(e["script"] for e in snapshot if e["script"].startswith("76a914")))
    bad_checksum = good[:-1] + ("2" if good[-1] != "2" else "3")
    for args, what in (
        (["--address", bad_checksum], "checksum"),
        (["--address", good[:5] + "0" + good[6:]], "character '0'"),
        (["--script", "76a9", "--address", good], "exclude"),
    ):
        r = run("utxos", *args)
        assert r.code == 2, args
        assert r.out == "" and len(r.err_lines) == 1 and what in r.err, (args, r.err)


def test_malformed_line_imports_nothing(
    run: Run, store_url: str, snapshot: list[Entry], tmp_path: Path
) -> None:
    good = [json.dumps(e) for e in snapshot[:3]]
    bad = {**snapshot[3], "vout": "one"}
    path = tmp_path / "snap.jsonl"
    path.write_text("\n".join([*good, json.dumps(bad)]) + "\n")
    args = ["--store-url", store_url, "import-utxos", str(path), "--height", "413566"]
    args += ["--block-hash", "00" * 32]
    r = run(*args)
    assert r.code == 2
    assert r.out == "" and len(r.err_lines) == 1 and "line 4" in r.err and "vout" in r.err, r.err

    # A line listed twice is caught before anything is written too.
    path.write_text("\n".join([*good, good[1]]) + "\n")
    r = run(*args)
    assert r.code == 2 and len(r.err_lines) == 1 and "line 4" in r.err and "twice" in r.err, r.err
    stats = run("--store-url", store_url, "stats").json()
    assert (stats["utxos"], stats["height"]) == (0, 0)  # not even the three good lines


def test_import_from_stdin_defaults_and_refuses_a_non_empty_store(run: Run, store_url: str) -> None:
    txid = "11" * 32
    lines = [
        {"txid": txid, "vout": 0, "satoshis": 5000, "script": "51"},  # no height: the snapshot's
        {"txid": txid, "vout": 2, "value": 7000, "script": "52"},
        {"txid": "22" * 32, "vout": 0, "value": 0, "script": "006a0568656c6c6f", "height": 90},
        {"txid": "33" * 32, "vout": 1, "value": 1, "script": "53", "height": 101, "coinbase": True},
    ]
    stdin = "".join(json.dumps(x) + "\n" for x in lines)
    args = ["--store-url", store_url, "import-utxos", "-", "--height", "100", "--block-hash", "AB" * 32]
    r = run(*args, stdin=stdin)
    assert r.code == 0, r.err
    # the set's commitment, computed here coin by coin (Core's coin serialisation)
    h = MuHash()
    for vout, sats, spk in ((0, 5000, b"\x51"), (2, 7000, b"\x52")):
        h.insert(coin_bytes(hex_to_hash(txid), vout, 100, False, sats, spk))
    assert r.json() == {
        "imported": 2, "skipped": 1, "data_carriers": 1, "height": 100, "block_hash": "ab" * 32,
        "muhash": h.hex(),
    }
    listed = run("--store-url", store_url, "utxos").lines()
    assert [(u["vout"], u["satoshis"], u["height"], u["coinbase"]) for u in listed] == [
        (0, 5000, 100, False), (2, 7000, 100, False),
    ]
    assert run("--store-url", store_url, "stats").json()["height"] == 100

    r = run(*args, stdin=stdin)
    assert r.code == 2 and len(r.err_lines) == 1 and "not empty" in r.err, r.err


def test_import_bad_options_exit_2(run: Run, data_dir: Path, tmp_path: Path) -> None:
    f = str(data_dir / PREVOUTS)
    for args, what in (
        ([f, "--height", "413566", "--block-hash", "xyz"], "--block-hash"),
        ([str(data_dir / "no-such-file.jsonl"), "--height", "1", "--block-hash", "00" * 32], "FILE"),
    ):
        r = run("--store-url", f"sqlite:///{tmp_path}/s.db", "import-utxos", *args)
        assert r.code == 2, args
        assert len(r.err_lines) == 1 and what in r.err, (args, r.err)


def test_reading_commands_never_create_a_store(run: Run, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "utxo.db"
    for args in (("stats",), ("utxos",), ("tx", "ab" * 32), ("outpoint", f"{'ab' * 32}:0")):
        r = run("--store-url", f"sqlite:///{missing}", *args)
        assert r.code == 2 and r.out == "", (args, r.out)
        assert r.err_lines == [f"utxo: error: [STORAGE_ERROR] no UTXO store at {missing}"], r.err
    assert not missing.parent.exists()
    r = run("stats")  # the default URL, relative to the working directory
    assert r.code == 2 and "no UTXO store at ./data/utxo.db" in r.err
    assert not (tmp_path / "data").exists()


def test_unreachable_or_unknown_stores_are_one_line_errors(run: Run) -> None:
    for url, words in (
        ("postgresql://postgres@127.0.0.1:1/x?password=hunter2", "cannot connect to PostgreSQL"),
        ("mysql://127.0.0.1/x", "unknown UTXO store URL scheme"),
    ):
        r = run("--store-url", url, "stats")
        assert r.code == 2 and r.out == "", url
        assert len(r.err_lines) == 1 and words in r.err, r.err
        assert "hunter2" not in r.err


def test_bare_utxo_is_a_one_line_usage_error(run: Run) -> None:
    r = run()
    assert r.code == 2 and r.out == "" and len(r.err_lines) == 1, r.err


def test_a_closed_pipe_ends_a_listing_quietly(imported: Imported) -> None:
    import os
    import subprocess
    import sys

    from tests.cli.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("UTXO_")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "workers.cli", "--store-url", imported.url, "utxos"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=imported.cwd)
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()  # the reader goes away, as `| head -1` does
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0, err
    assert first.startswith(b'{"txid"') and err == b""
