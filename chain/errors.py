"""The one error the chain primitives raise: malformed bytes, with the offset where they broke."""

from __future__ import annotations


class ParseError(ValueError):
    """Bytes that are not a BSV block or transaction.

    `offset` is the byte position (from the start of the buffer handed to the parser) at which
    the problem was found, so a user can look at the exact spot in a hex dump.
    """

    def __init__(self, what: str, offset: int) -> None:
        super().__init__(f"{what} (at byte offset {offset})")
        self.what = what
        self.offset = offset
