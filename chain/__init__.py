"""Bitcoin (BSV) chain primitives: parsing, hashes, merkle roots, proof of work, UTXO hashes.

This package imports nothing else of ours; every other package may import it.
"""

from chain.block import (
    BLK_MAGICS,
    BODY_MISMATCH,
    Block,
    BlockHeader,
    bip34_height,
    bits_to_target,
    block_work,
    check_block,
    check_pow,
    iter_blk_records,
    merkle_root,
    parse_block,
    parse_header,
)
from chain.errors import ParseError
from chain.hashes import hash_to_hex, hex_to_hash, sha256d
from chain.tx import (
    COINBASE_PREV_TXID,
    COINBASE_PREV_VOUT,
    Tx,
    TxIn,
    TxOut,
    parse_tx,
)
from chain.utxo import is_data_carrier, spent_hashes, utxo_hash, utxo_hashes

__all__ = [
    "BLK_MAGICS",
    "BODY_MISMATCH",
    "COINBASE_PREV_TXID",
    "COINBASE_PREV_VOUT",
    "Block",
    "BlockHeader",
    "ParseError",
    "Tx",
    "TxIn",
    "TxOut",
    "bip34_height",
    "bits_to_target",
    "block_work",
    "check_block",
    "check_pow",
    "hash_to_hex",
    "hex_to_hash",
    "is_data_carrier",
    "iter_blk_records",
    "merkle_root",
    "parse_block",
    "parse_header",
    "parse_tx",
    "sha256d",
    "spent_hashes",
    "utxo_hash",
    "utxo_hashes",
]
