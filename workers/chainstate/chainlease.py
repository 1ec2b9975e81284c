"""The chain's lease: its name in the state store, and what a caller is told when it cannot go on
(`ChainBusy`: another worker holds it; `Unfinished`: the time budget ran out first)."""

from __future__ import annotations

LEASE = "chain"  # applying the best chain


class ChainBusy(Exception):
    """Another worker holds the chain's lease: it applies the chain; try again shortly."""


class Unfinished(Exception):
    """`advance` used up its time budget with blocks still to apply: call it again."""
