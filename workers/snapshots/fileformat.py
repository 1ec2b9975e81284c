"""The snapshot file: what `utxo export-utxos` writes and `utxo import-utxos` reads.

Invariants:
- A file is JSON lines. The first may be a header, {"snapshot": {"height","block_hash","muhash",
  "utxos","satoshis"}} (`Header`), naming the block the set was taken at and committing to the
  set; every other line is one output, {"txid","vout","satoshis" (or "value"),"script",
  "height","coinbase"}.
- Reading is strict: a key the header does not know might be a promise no one can check, so it
  is refused; every value is range-checked before it is used. What is wrong is a SnapshotError
  (a ValueError) that says why, and where a line is at fault, its number.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from chain import hash_to_hex, hex_to_hash
from stores.utxo.validate import MAX_VOUT

MAX_MONEY = 21_000_000 * 100_000_000
MAX_COUNT = 2**63 - 1  # a header's outputs and satoshis: what an SQL bigint holds
HEADER_KEYS = ("height", "block_hash", "muhash", "utxos", "satoshis")


class SnapshotError(ValueError):
    """A snapshot file that cannot be taken: the message names the line where one is at fault."""


def _int(obj: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key!r} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{key!r} must be in {lo}..{hi}, got {v}")
    return v


@dataclass(frozen=True, slots=True)
class Header:
    """A snapshot file's first line (`utxo export-utxos` writes it): the block the set was taken
    at, and the set's commitment as the chain kept it for that block."""

    height: int
    block_hash: bytes  # internal order
    muhash: str  # as Bitcoin Core prints it: 64 lower-case hex digits
    utxos: int
    satoshis: int

    def line(self) -> str:
        body = {
            "height": self.height, "block_hash": hash_to_hex(self.block_hash), "muhash": self.muhash,
            "utxos": self.utxos, "satoshis": self.satoshis,
        }
        return json.dumps({"snapshot": body}) + "\n"

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Header:
        """The header of a first line's object (one with a "snapshot" key); ValueError says why not.
        Strict: a key it does not know might be a promise it cannot check."""
        others = set(obj) - {"snapshot"}
        if others:
            raise ValueError(f"a snapshot header holds 'snapshot' only, not also {_keys(others)}")
        body = obj["snapshot"]
        if not isinstance(body, dict):
            raise ValueError(f"'snapshot' must be an object, got {body!r}")
        missing = [k for k in HEADER_KEYS if k not in body]
        if missing:
            raise ValueError(f"'snapshot' is missing {_keys(missing)}")
        if set(body) - set(HEADER_KEYS):
            raise ValueError(f"'snapshot' holds unknown {_keys(set(body) - set(HEADER_KEYS))}")
        block_hash, muhash = body["block_hash"], body["muhash"]
        if not isinstance(block_hash, str):
            raise ValueError(f"'block_hash' must be a string, got {block_hash!r}")
        try:
            block = hex_to_hash(block_hash)
        except ValueError as e:
            raise ValueError(f"'block_hash': {e}") from None
        if not isinstance(muhash, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", muhash):
            raise ValueError(f"'muhash' must be 64 hex digits, got {muhash!r}")
        return cls(
            _int(body, "height", 1, 2**31 - 1), block, muhash.lower(),
            _int(body, "utxos", 0, MAX_COUNT), _int(body, "satoshis", 0, MAX_COUNT),
        )


def _keys(keys: Iterable[str]) -> str:
    return ", ".join(repr(k) for k in sorted(keys))


def read_header(first: bytes) -> Header | None:
    """The header on a file's first line, or None when that line is not one (an entry, or
    something the entries' checks will name)."""
    try:
        obj = json.loads(first)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(obj, dict) or "snapshot" not in obj:
        return None
    try:
        return Header.from_json(obj)
    except ValueError as e:
        raise SnapshotError(f"line 1: {e}") from None


def parse_entry(text: str, default_height: int) -> tuple[bytes, int, int, bytes, int, bool]:
    """One JSON line → (txid, vout, satoshis, script, height, coinbase). ValueError says why not."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise ValueError("not a snapshot entry: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "snapshot" in obj:
        raise ValueError("a snapshot header belongs on the first line only")
    missing = [k for k in ("txid", "vout", "script") if k not in obj]
    if "satoshis" not in obj and "value" not in obj:
        missing.append("satoshis")
    if missing:
        raise ValueError(f"missing {', '.join(repr(k) for k in missing)}")
    if not isinstance(obj["txid"], str):
        raise ValueError(f"'txid' must be a string, got {obj['txid']!r}")
    try:
        txid = hex_to_hash(obj["txid"])
    except ValueError as e:
        raise ValueError(f"'txid': {e}") from None
    vout = _int(obj, "vout", 0, MAX_VOUT)
    sats_key = "satoshis" if "satoshis" in obj else "value"
    sats = _int(obj, sats_key, 0, MAX_MONEY)
    if "satoshis" in obj and "value" in obj and obj["value"] != sats:
        raise ValueError(f"'satoshis' ({sats}) and 'value' ({obj['value']!r}) disagree")
    script_hex = obj["script"]
    if not isinstance(script_hex, str):
        raise ValueError(f"'script' must be a hex string, got {script_hex!r}")
    try:
        script = bytes.fromhex(script_hex)
    except ValueError:
        raise ValueError(f"'script' is not hex: {script_hex[:80]!r}") from None
    height = default_height if obj.get("height") is None else _int(obj, "height", 0, 2**31 - 1)
    coinbase = obj.get("coinbase", False)
    if coinbase is None:
        coinbase = False
    if not isinstance(coinbase, bool):
        raise ValueError(f"'coinbase' must be true or false, got {coinbase!r}")
    return txid, vout, sats, script, height, coinbase
