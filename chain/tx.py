"""Transactions: the standard serialization and BIP-239 extended format.

Invariants:
- `Tx.raw` is always the *standard* serialization and `Tx.txid == sha256d(Tx.raw)`, whatever
  format the bytes came in; extended data (each input's previous satoshis and script) lives only
  on the `TxIn` objects.
- The parser never allocates from a count it has not checked against the bytes that remain, so a
  varint claiming 2^60 inputs fails at once instead of exhausting memory.
- Every varint must be canonical (its shortest encoding), as Bitcoin's ReadCompactSize demands;
  any malformed input raises ParseError (never IndexError, struct.error or MemoryError).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from hashlib import sha256

from chain.errors import ParseError
from chain.hashes import hash_to_hex, sha256d

COINBASE_PREV_TXID = b"\x00" * 32
COINBASE_PREV_VOUT = 0xFFFFFFFF
COINBASE_OUTPOINT = (COINBASE_PREV_TXID, COINBASE_PREV_VOUT)
EXTENDED_MARKER = b"\x00\x00\x00\x00\x00\xef"
# Smallest encodings, used to bound counts before looping: an input is 32+4+1+4 bytes, an
# output 8+1 bytes (extended inputs are larger, so the bound stays safe).
_MIN_INPUT = 41
_MIN_OUTPUT = 9

_u32 = struct.Struct("<I").unpack_from
# One call per input head (previous txid, vout, first byte of the script length) and per output
# head (satoshis, first byte of the script length): the hot path of block parsing.
_in_head = struct.Struct("<32sIB").unpack_from
_out_head = struct.Struct("<QB").unpack_from
_seq_in_head = struct.Struct("<I32sIB").unpack_from  # a sequence, then the next input's head
_seq_count = struct.Struct("<IB").unpack_from  # a 4-byte field, then a varint's first byte
# Multi-byte varints: prefix → (payload size, smallest value that needs this prefix).
_VARINT_WIDE = {0xFD: (2, 0xFD), 0xFE: (4, 0x10000), 0xFF: (8, 0x100000000)}


@dataclass(slots=True)
class TxIn:
    prev_txid: bytes  # internal byte order
    prev_vout: int
    script_sig: bytes
    sequence: int
    prev_satoshis: int | None = None  # extended format only
    prev_script: bytes | None = None  # extended format only


@dataclass(slots=True)
class TxOut:
    satoshis: int
    script: bytes


@dataclass(slots=True)
class Tx:
    version: int
    inputs: list[TxIn]
    outputs: list[TxOut]
    locktime: int
    raw: bytes  # standard serialization
    txid: bytes = field(default=b"")  # internal byte order; computed from raw when empty

    def __post_init__(self) -> None:
        if not self.txid:
            self.txid = sha256d(self.raw)

    @property
    def txid_hex(self) -> str:
        return hash_to_hex(self.txid)

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def is_coinbase(self) -> bool:
        ins = self.inputs
        return (
            len(ins) == 1
            and ins[0].prev_vout == COINBASE_PREV_VOUT
            and ins[0].prev_txid == COINBASE_PREV_TXID
        )

    @property
    def is_extended(self) -> bool:
        """True when every input carries its previous output (coinbase needs none)."""
        if self.is_coinbase:
            return True
        return all(i.prev_satoshis is not None and i.prev_script is not None for i in self.inputs)

    def fee(self) -> int | None:
        """Inputs minus outputs; 0 for a coinbase; None when an input's value is unknown."""
        if self.is_coinbase:
            return 0
        total_in = 0
        for i in self.inputs:
            if i.prev_satoshis is None:
                return None
            total_in += i.prev_satoshis
        return total_in - sum(o.satoshis for o in self.outputs)

    def serialize(self, extended: bool = False) -> bytes:
        """Standard bytes (== raw), or BIP-239 extended bytes (needs every prevout)."""
        if not extended:
            return self.raw
        if not self.is_extended:
            raise ValueError(f"tx {self.txid_hex}: extended format needs every input's previous output")
        return serialize(self.version, self.inputs, self.outputs, self.locktime, extended=True)

    def inpoints(self) -> list[tuple[bytes, int]]:
        """(parent txid, vout) of every input; empty for a coinbase."""
        if self.is_coinbase:
            return []
        return [(i.prev_txid, i.prev_vout) for i in self.inputs]


def serialize(
    version: int, inputs: Sequence[TxIn], outputs: Sequence[TxOut], locktime: int, *, extended: bool = False
) -> bytes:
    """A transaction's bytes from its parts: standard, or BIP-239 extended (each input followed
    by its previous output; a coinbase input by zero satoshis and an empty script)."""
    # One growing buffer, not a list of parts to join: joining costs a buffer record per part,
    # which for a million-output transaction is hundreds of megabytes on top of the result.
    buf = bytearray(struct.pack("<I", version))
    if extended:
        buf += EXTENDED_MARKER
    buf += varint(len(inputs))
    coinbase = len(inputs) == 1 and (inputs[0].prev_txid, inputs[0].prev_vout) == COINBASE_OUTPOINT
    for i in inputs:
        buf += i.prev_txid
        buf += struct.pack("<I", i.prev_vout)
        buf += varint(len(i.script_sig))
        buf += i.script_sig
        buf += struct.pack("<I", i.sequence)
        if extended:
            if coinbase:
                buf += struct.pack("<Q", 0) + b"\x00"
            else:
                assert i.prev_script is not None and i.prev_satoshis is not None
                buf += struct.pack("<Q", i.prev_satoshis)
                buf += varint(len(i.prev_script))
                buf += i.prev_script
    buf += varint(len(outputs))
    for o in outputs:
        buf += struct.pack("<Q", o.satoshis)
        buf += varint(len(o.script))
        buf += o.script
    buf += struct.pack("<I", locktime)
    return bytes(buf)


def varint(n: int) -> bytes:
    if n < 0xFD:
        return bytes((n,))
    if n <= 0xFFFF:
        return b"\xfd" + struct.pack("<H", n)
    if n <= 0xFFFFFFFF:
        return b"\xfe" + struct.pack("<I", n)
    return b"\xff" + struct.pack("<Q", n)


def parse_tx(data: bytes, *, allow_trailing: bool = False) -> Tx:
    """Parse one transaction, standard or extended. Trailing bytes are an error unless allowed."""
    buf = bytes(data)
    tx, end = read_tx(buf, 0)
    if end != len(buf) and not allow_trailing:
        raise ParseError(f"{len(buf) - end} trailing bytes after the transaction", end)
    return tx


def _varint_at(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    """The varint whose first byte is at `pos`, and the offset past it. Refuses the truncated and
    the non-canonical (a value that fits a shorter encoding), as Bitcoin's ReadCompactSize does."""
    try:
        n = buf[pos]
    except IndexError:
        raise ParseError(f"truncated: {what} missing", pos) from None
    if n < 0xFD:
        return n, pos + 1
    size, smallest = _VARINT_WIDE[n]
    end = pos + 1 + size
    if end > len(buf):
        raise ParseError(f"truncated: {what} varint cut short", pos)
    value = int.from_bytes(buf[pos + 1 : end], "little")
    if value < smallest:
        raise ParseError(f"non-canonical varint for {what}: {value} written in {1 + size} bytes", pos)
    return value, end


def read_tx(buf: bytes, start: int) -> tuple[Tx, int]:
    """Parse the transaction beginning at `start`; return it and the offset just past it."""
    txs, end = read_txs(buf, start, 1)
    return txs[0], end


def read_txs(buf: bytes, start: int, count: int, *, in_block: bool = False) -> tuple[list[Tx], int]:
    """Parse `count` consecutive transactions from `start`; return them and the offset past them.

    With `in_block`, errors name the transaction ("transaction 3 of 10: ...") and the extended
    format is refused (a block holds standard transactions only).

    Hot path for block parsing, hence one function for the whole loop: one struct call per input
    or output (an input's sequence is read with the next input's head), one-byte varints decoded
    inline, and the only checks per field are those that keep a malformed buffer from being
    misread (a short read raises struct.error or IndexError, turned into ParseError).
    """
    blen = len(buf)
    txs: list[Tx] = []
    append_tx = txs.append
    pos = start
    try:
        for _ in range(count):
            tx_start = pos
            if tx_start + 10 > blen:
                raise ParseError("truncated transaction: fewer than 10 bytes", tx_start)
            version, n_in = _seq_count(buf, tx_start)
            pos = tx_start + 5
            if n_in == 0:
                if buf[pos - 1 : pos + 5] == EXTENDED_MARKER:
                    if in_block:
                        raise ParseError("extended format (BIP-239) inside a block", tx_start)
                    tx, pos = _read_extended_tx(buf, tx_start, version)
                    append_tx(tx)
                    continue
                if buf[pos] == 1:
                    raise ParseError(
                        "SegWit serialization (marker 0x00, flag 0x01): BSV has no SegWit; "
                        "this is a BTC transaction or block",
                        pos - 1,
                    )
                raise ParseError("transaction has no inputs", pos - 1)
            if n_in >= 0xFD:
                n_in, pos = _varint_at(buf, pos - 1, "input count")
            if n_in * _MIN_INPUT > blen - pos:
                raise ParseError(f"input count {n_in} exceeds the {blen - pos} bytes that remain", pos)
            inputs: list[TxIn] = []
            append_in = inputs.append
            try:
                prev, vout, slen = _in_head(buf, pos)
                pos += 37
                for _ in range(n_in - 1):
                    if slen >= 0xFD:
                        slen, pos = _varint_at(buf, pos - 1, "script length")
                    end = pos + slen
                    if end + 4 > blen:
                        raise ParseError(f"truncated: input script of {slen} bytes runs past the end", pos)
                    script = buf[pos:end]
                    pos = end + 4
                    seq, prev2, vout2, slen = _seq_in_head(buf, end)
                    append_in(TxIn(prev, vout, script, seq, None, None))
                    prev = prev2
                    vout = vout2
                    pos += 37
                if slen >= 0xFD:
                    slen, pos = _varint_at(buf, pos - 1, "script length")
                end = pos + slen
                if end + 4 > blen:
                    raise ParseError(f"truncated: input script of {slen} bytes runs past the end", pos)
                script = buf[pos:end]
                pos = end + 4
                append_in(TxIn(prev, vout, script, _u32(buf, end)[0], None, None))
                outputs, locktime, pos = _read_outputs(buf, pos)
            except (IndexError, struct.error):
                raise ParseError("truncated transaction", min(pos, blen)) from None
            raw = buf[tx_start:pos]
            append_tx(Tx(version, inputs, outputs, locktime, raw, sha256(sha256(raw).digest()).digest()))
    except ParseError as e:
        if not in_block:
            raise
        raise ParseError(f"transaction {len(txs)} of {count}: {e.what}", e.offset) from None
    return txs, pos


def _read_outputs(buf: bytes, pos: int) -> tuple[list[TxOut], int, int]:
    """The output count, outputs and locktime at `pos`: (outputs, locktime, offset past them)."""
    blen = len(buf)
    try:
        n_out = buf[pos]
        pos += 1
        if n_out >= 0xFD:
            n_out, pos = _varint_at(buf, pos - 1, "output count")
        if n_out * _MIN_OUTPUT > blen - pos:
            raise ParseError(f"output count {n_out} exceeds the {blen - pos} bytes that remain", pos)
        outputs: list[TxOut] = []
        append_out = outputs.append
        for _ in range(n_out):
            sats, slen = _out_head(buf, pos)
            pos += 9
            if slen >= 0xFD:
                slen, pos = _varint_at(buf, pos - 1, "script length")
            end = pos + slen
            if end > blen:
                raise ParseError(f"truncated: output script of {slen} bytes runs past the end", pos)
            append_out(TxOut(sats, buf[pos:end]))
            pos = end
        locktime = _u32(buf, pos)[0]
    except (IndexError, struct.error):
        raise ParseError("truncated transaction", min(pos, blen)) from None
    return outputs, locktime, pos + 4


def tx_outputs(raw: bytes) -> list[TxOut]:
    """Only the outputs of a transaction (standard or extended): the inputs are skipped, not
    built, and no txid is computed (for readers that know the txid already, such as a UTXO
    listing)."""
    return _read_outputs(raw, outputs_offset(raw))[0]


def outputs_offset(raw: bytes) -> int:
    """Where the output count of a standard or extended transaction starts: the inputs are
    walked over, not built."""
    blen = len(raw)
    extended = raw[4:10] == EXTENDED_MARKER
    pos = 10 if extended else 4
    try:
        n_in, pos = _varint_at(raw, pos, "input count")
        for _ in range(n_in):
            slen, pos = _varint_at(raw, pos + 36, "script length")
            pos += slen + 4
            if extended:
                pslen, pos = _varint_at(raw, pos + 8, "previous script length")
                pos += pslen
    except IndexError:
        raise ParseError("truncated transaction", min(pos, blen)) from None
    if pos > blen:
        raise ParseError("truncated transaction", blen)
    return pos


def iter_outputs(raw: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(vout, satoshis, script) of each output of a standard or extended transaction, one at a
    time: a reader of a few outputs of a million-output transaction builds only those."""
    blen = len(raw)
    pos = outputs_offset(raw)
    try:
        n_out, pos = _varint_at(raw, pos, "output count")
        if n_out * _MIN_OUTPUT > blen - pos:
            raise ParseError(f"output count {n_out} exceeds the {blen - pos} bytes that remain", pos)
        for vout in range(n_out):
            sats, slen = _out_head(raw, pos)
            pos += 9
            if slen >= 0xFD:
                slen, pos = _varint_at(raw, pos - 1, "script length")
            end = pos + slen
            if end > blen:
                raise ParseError(f"truncated: output script of {slen} bytes runs past the end", pos)
            yield vout, sats, raw[pos:end]
            pos = end
    except (IndexError, struct.error):
        raise ParseError("truncated transaction", min(pos, blen)) from None


def _read_extended_tx(buf: bytes, start: int, version: int) -> tuple[Tx, int]:
    """BIP-239 extended format (the marker follows the version): each input also carries its
    previous output's satoshis and script. `raw` is rebuilt as the standard serialization."""
    blen = len(buf)
    pos = start + 4 + len(EXTENDED_MARKER)
    n_in, pos = _varint_at(buf, pos, "input count")
    if n_in == 0:
        raise ParseError("transaction has no inputs", pos - 1)
    if n_in * _MIN_INPUT > blen - pos:
        raise ParseError(f"input count {n_in} exceeds the {blen - pos} bytes that remain", pos)
    inputs: list[TxIn] = []
    std_parts: list[bytes] = [buf[start : start + 4], varint(n_in)]
    try:
        for _ in range(n_in):
            in_start = pos
            prev, vout, slen = _in_head(buf, pos)
            pos += 37
            if slen >= 0xFD:
                slen, pos = _varint_at(buf, pos - 1, "script length")
            end = pos + slen
            if end + 4 > blen:
                raise ParseError(f"truncated: input script of {slen} bytes runs past the end", pos)
            script = buf[pos:end]
            seq = _u32(buf, end)[0]
            pos = end + 4
            std_parts.append(buf[in_start:pos])
            psats, pslen = _out_head(buf, pos)
            pos += 9
            if pslen >= 0xFD:
                pslen, pos = _varint_at(buf, pos - 1, "previous script length")
            if pos + pslen > blen:
                raise ParseError("truncated: extended previous script runs past the end", pos)
            inputs.append(TxIn(prev, vout, script, seq, psats, buf[pos : pos + pslen]))
            pos += pslen
    except (IndexError, struct.error):
        raise ParseError("truncated transaction", min(pos, blen)) from None
    if n_in == 1 and inputs[0].prev_vout == COINBASE_PREV_VOUT and inputs[0].prev_txid == COINBASE_PREV_TXID:
        # A coinbase spends nothing: whatever its extended bytes say, it has no previous output.
        inputs[0].prev_satoshis = None
        inputs[0].prev_script = None
    out_start = pos
    outputs, locktime, end = _read_outputs(buf, pos)
    std_parts.append(buf[out_start:end])
    raw = b"".join(std_parts)
    return Tx(version, inputs, outputs, locktime, raw, sha256(sha256(raw).digest()).digest()), end
