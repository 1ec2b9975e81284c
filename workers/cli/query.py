"""Read-only commands: config, tx, outpoint, utxos, stats. They read the store directly."""

from __future__ import annotations

import re
import sys

import click

from chain import hex_to_hash
from chain.address import address_to_script
from stores.utxo import TxNotFound
from workers.cli.app import BadInput, Context, NotFound, OutputClosed, cli, emit

MAX_VOUT = 0xFFFFFFFF


def parse_txid(text: str, what: str = "TXID") -> bytes:
    try:
        return hex_to_hash(text)
    except ValueError as e:
        raise BadInput(f"{what}: {e}") from None


def parse_outpoint(text: str) -> tuple[bytes, int]:
    txid_hex, sep, vout_text = text.strip().rpartition(":")
    if not sep:
        raise BadInput(f"OUTPOINT: expected TXID:VOUT, got {text!r}")
    txid = parse_txid(txid_hex, "OUTPOINT txid")
    if not re.fullmatch(r"[0-9]{1,10}", vout_text) or int(vout_text) > MAX_VOUT:
        raise BadInput(f"OUTPOINT: the output index must be an integer 0..{MAX_VOUT}, got {vout_text!r}")
    return txid, int(vout_text)


def parse_script(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise BadInput(f"--script: not hex: {text[:80]!r}") from None


@cli.command("config")
@click.pass_obj
def config_cmd(obj: Context) -> None:
    """The effective settings as one JSON object.

    Keys are the variable names in lower case without the UTXO_ prefix (UTXO_STORE_URL is
    "store_url"); durations are seconds; passwords in URLs are masked.
    """
    emit(obj.settings.public())


@cli.command("tx")
@click.argument("txid")
@click.pass_obj
def tx_cmd(obj: Context, txid: str) -> None:
    """A transaction record's metadata; "hex" holds the raw transaction when the store has it."""
    key = parse_txid(txid)
    store = obj.open_store(create=False)
    try:
        meta = store.get(key)
    except TxNotFound:
        raise NotFound(f"tx {txid.strip().lower()} is not in the store") from None
    finally:
        store.close()
    out = meta.to_json()
    if meta.tx is not None:
        out["hex"] = meta.tx.raw.hex()
    emit(out)


@cli.command("outpoint")
@click.argument("outpoint", metavar="TXID:VOUT")
@click.pass_obj
def outpoint_cmd(obj: Context, outpoint: str) -> None:
    """One output: {"state": unspent|spent|frozen|missing, "spending_txid"?, "spending_vin"?, "utxo_hash"}.

    A missing output prints {"state": "missing"} and exits 1.
    """
    key = parse_outpoint(outpoint)
    store = obj.open_store(create=False)
    try:
        info = store.get_output(key)
    finally:
        store.close()
    if info is None:
        emit({"state": "missing"})
        raise NotFound(f"outpoint {outpoint.strip()} is not in the store")
    emit(info.to_json())


@cli.command("utxos")
@click.option("--confirmed", is_flag=True, help="Only the confirmed set (mined on the best chain).")
@click.option("--script", "script_hex", metavar="HEX", help="Only outputs with this locking script.")
@click.option("--address", metavar="ADDR", help="Only outputs paying this P2PKH or P2SH address.")
@click.pass_obj
def utxos_cmd(obj: Context, confirmed: bool, script_hex: str | None, address: str | None) -> None:
    """Unspent outputs as JSON lines {"txid","vout","satoshis","script","height","coinbase"}.

    Without --confirmed: every unspent output of a non-conflicting record, mined or not.
    """
    if script_hex is not None and address is not None:
        raise BadInput("--script and --address exclude each other")
    script: bytes | None = None
    if script_hex is not None:
        script = parse_script(script_hex)
    elif address is not None:
        try:
            script = address_to_script(address)
        except ValueError as e:
            raise BadInput(f"--address: {e}") from None
    store = obj.open_store(create=False)
    write = sys.stdout.write
    rows = store.iter_utxos(confirmed=confirmed, script=script)
    try:
        for u in rows:
            write(u.json_line())
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed() from None
    finally:
        close = getattr(rows, "close", None)  # a generator: release its cursor early
        if close is not None:
            close()
        store.close()


@cli.command("stats")
@click.pass_obj
def stats_cmd(obj: Context) -> None:
    """{"utxos","satoshis","height","txs"} of the confirmed set."""
    store = obj.open_store(create=False)
    try:
        emit(store.stats().to_json())
    finally:
        store.close()
