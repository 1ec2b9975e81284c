"""The state store: the chain's block index (hash, parent, height, cumulative work, status),
the best-chain tip, per-block undo records and named leases; SQLite or PostgreSQL by URL."""

from stores.state.factory import open_state_store
from stores.state.protocol import BlockEntry, BlockStatus, StateStore

__all__ = ["BlockEntry", "BlockStatus", "StateStore", "open_state_store"]
