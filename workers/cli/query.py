"""Read-only commands: config, tx, outpoint, utxos, stats. They read the store directly."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

import click

from chain import hash_to_hex, hex_to_hash
from chain.address import address_to_script
from stores.utxo import ProcessingError, TxNotFound, UtxoStore, scriptindex
from workers.cli.app import BadInput, Context, NotFound, OutputClosed, cli, emit, log

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
        raise NotFound(f"tx {hash_to_hex(key)} is not in the store{_refused(obj, key)}") from None
    finally:
        store.close()
    out = meta.to_json()
    if meta.tx is not None:
        out["hex"] = meta.tx.raw.hex()
    emit(out)


def _refused(obj: Context, txid: bytes) -> str:
    """Why the tx was refused, when the state store logged it (stores/state/refusals.py), or
    what it waits for while it is pending (its parents)."""
    from stores.errors import StoreError

    try:
        state = obj.open_state(create=False)
    except StoreError:  # no state store (a store used without workers): nothing to tell
        return ""
    ident = f"tx:{hash_to_hex(txid)}"
    try:
        found = state.refusals([ident])
        _n, waits = state.waiting([ident]) if not found else (0, {})
    finally:
        state.close()
    r = next(iter(found.values()), None)
    if r is None:  # not refused: pending, maybe waiting for its parents
        return f": it is pending and {waits[ident][0]}" if ident in waits else ""
    rival = f"; {r.rival} holds what it wanted" if r.rival else ""
    return f": it was refused ({r.reason}{rival})"


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


P2PK_HINT = (
    "no unspent output pays {addr} as P2PKH or P2SH; outputs that pay its public key itself (P2PK, "
    "as early coinbases do) are found by their script: --script 41<65-byte key>ac or 21<33-byte key>ac"
)


def script_selector(script_hex: str | None, address: str | None, scripthash: str | None) -> bytes | None:
    """The scripthash (SHA-256 of the locking script, internal order) the options name, if any."""
    given = [n for n, v in (("--script", script_hex), ("--address", address), ("--scripthash", scripthash))
             if v is not None]
    if len(given) > 1:
        raise BadInput(f"{' and '.join(given)} exclude each other")
    if script_hex is not None:
        return scriptindex.scripthash(parse_script(script_hex))
    if address is not None:
        try:
            return scriptindex.scripthash(address_to_script(address))
        except ValueError as e:
            raise BadInput(f"--address: {e}") from None
    if scripthash is not None:
        return parse_txid(scripthash, "--scripthash")
    return None


@cli.command("utxos")
@click.option("--confirmed", is_flag=True, help="Only the confirmed set (mined on the best chain).")
@click.option("--script", "script_hex", metavar="HEX", help="Only outputs with this locking script.")
@click.option("--address", metavar="ADDR", help="Only outputs paying this P2PKH or P2SH address.")
@click.option("--scripthash", metavar="HASH",
              help="Only outputs whose script has this SHA-256 (Electrum's scripthash, byte-reversed hex).")
@click.option("--limit", type=click.IntRange(1, scriptindex.PAGE_LIMIT), default=None,
              help="With a script: at most this many outputs (one page); go on with --after.")
@click.option("--after", "after", metavar="CURSOR", default=None,
              help="With a script: the outputs after this cursor (the last line's \"cursor\").")
@click.pass_obj
def utxos_cmd(
    obj: Context, confirmed: bool, script_hex: str | None, address: str | None, scripthash: str | None,
    limit: int | None, after: str | None,
) -> None:
    """Unspent outputs as JSON lines {"txid","vout","satoshis","script","height","coinbase"}.

    Without --confirmed: every unspent output of a non-conflicting record, mined or not.

    With --script, --address or --scripthash the script index answers, in time that grows with
    what the script owns, not with the store: each line adds "confirmed" and "cursor", lines come
    in the order the outputs reached the store, and an output spent by an unconfirmed
    transaction is not listed (it is spent). P2PK outputs (early coinbases) pay a public key, not
    an address: find them with --script.
    """
    h = script_selector(script_hex, address, scripthash)
    if h is None and (limit is not None or after is not None):
        raise BadInput(
            "--limit and --after page a script's outputs: give --script, --address or --scripthash"
        )
    store = obj.open_store(create=False)
    write = sys.stdout.write
    try:
        if h is not None:
            n = _script_lines(store, h, confirmed, limit, after, write)
            if n == 0 and address is not None and after is None:
                log(P2PK_HINT.format(addr=address))
            return
        rows = store.iter_utxos(confirmed=confirmed)
        try:
            for u in rows:
                write(u.json_line())
        finally:
            close = getattr(rows, "close", None)  # a generator: release its cursor early
            if close is not None:
                close()
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed() from None
    except ProcessingError as e:  # (a cursor this store never handed out)
        raise BadInput(f"--after: {e}" if after is not None else str(e)) from None
    finally:
        store.close()


def _script_lines(
    store: UtxoStore, h: bytes, confirmed: bool, limit: int | None, after: str | None,
    write: Callable[[str], object],
) -> int:
    """Write the script's outputs (one page of `limit`, or all); how many."""
    n = 0
    while True:
        page = limit or scriptindex.PAGE_LIMIT
        items, after = store.script_utxos(h, after=after, limit=page, confirmed=confirmed)
        for u in items:
            write(u.json_line())
        n += len(items)
        if after is None or limit is not None:
            sys.stdout.flush()
            return n


@cli.command("balance")
@click.option("--script", "script_hex", metavar="HEX", help="The outputs with this locking script.")
@click.option("--address", metavar="ADDR", help="The outputs paying this P2PKH or P2SH address.")
@click.option("--scripthash", metavar="HASH",
              help="The outputs whose script has this SHA-256 (byte-reversed hex).")
@click.pass_obj
def balance_cmd(obj: Context, script_hex: str | None, address: str | None, scripthash: str | None) -> None:
    """{"confirmed", "unconfirmed", "utxos"} of a script's unspent outputs, from the script index:
    satoshis of those mined on the best chain, of the others, and how many there are. An
    --address that owns nothing gets a hint on stderr: P2PK outputs pay a key, not an address."""
    h = script_selector(script_hex, address, scripthash)
    if h is None:
        raise BadInput("give one of --script, --address or --scripthash")
    store = obj.open_store(create=False)
    try:
        balance = store.script_balance(h)
    finally:
        store.close()
    if balance.utxos == 0 and address is not None:
        log(P2PK_HINT.format(addr=address))
    emit(balance.to_json())


@cli.command("stats")
@click.option("--hash", "hash_type", type=click.Choice(["none", "muhash"]), default="none", show_default=True,
              help="muhash: the tip's commitment to the confirmed set (kept block by block), at once.")
@click.option("--verify", is_flag=True,
              help="With --hash muhash: compute it again from the store's confirmed set, and exit 1 "
                   "if the two differ.")
@click.pass_obj
def stats_cmd(obj: Context, hash_type: str, verify: bool) -> None:
    """{"utxos","satoshis","height","txs"} of the confirmed set, counted from the store.

    With --hash muhash: {"height","hash","muhash","utxos","satoshis"} of the tip, from the
    commitment the chain keeps per block (MuHash3072 over the confirmed set, exactly as Bitcoin
    Core's `gettxoutsetinfo muhash`); --verify adds "verified" after recomputing it."""
    if verify and hash_type != "muhash":
        raise BadInput("--verify needs --hash muhash")
    if hash_type == "muhash":
        emit(_tip_commitment(obj, verify))
        return
    store = obj.open_store(create=False)
    try:
        emit(store.stats().to_json())
    finally:
        store.close()


def _tip_commitment(obj: Context, verify: bool) -> dict[str, Any]:
    from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)

    state = obj.open_state(create=False)
    try:
        tip = state.tip()
        made = state.get_commitment(tip.hash) if tip is not None else None
        if tip is None:
            raise NotFound("no block has been applied yet")
        if made is None:  # (a chain applied before commitments: its next block computes one)
            raise NotFound(f"the tip {hash_to_hex(tip.hash)} has no commitment yet (it was applied "
                           "before commitments were kept: the next block computes one)")
        out: dict[str, Any] = {"height": tip.height, "hash": hash_to_hex(tip.hash)}
        out |= commitment.to_json(made)
        if not verify:
            return out
        store = obj.open_store(create=False)
        try:
            again = commitment.of_utxos(store.iter_utxos(confirmed=True))
        finally:
            store.close()
        after = state.tip()
    finally:
        state.close()
    if after is None or after.hash != tip.hash:
        raise BadInput("the chain moved while the confirmed set was read: stop the workers (or wait "
                       "for `utxo wait`) and verify again")
    if again != made:
        emit({**out, "verified": False, "computed": commitment.to_json(again)})
        raise NotFound(f"the store's confirmed set does not match the tip's commitment: "
                       f"{commitment.muhash_hex(again)} computed, {out['muhash']} kept")
    return {**out, "verified": True}
