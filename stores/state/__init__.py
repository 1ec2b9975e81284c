"""The state store: the chain's block index (hash, parent, height, cumulative work, status),
the best-chain tip, per-block undo records, named leases and the registry of pending messages;
SQLite or PostgreSQL by URL."""

from stores.state.factory import open_state_store
from stores.state.protocol import (
    KEEP,
    PENDING_KINDS,
    BlockChange,
    BlockEntry,
    BlockStatus,
    PendingEntry,
    StateStore,
)

__all__ = [
    "KEEP", "PENDING_KINDS", "BlockChange", "BlockEntry", "BlockStatus", "PendingEntry", "StateStore",
    "open_state_store",
]
