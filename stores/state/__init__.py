"""The state store: the chain's block index (hash, parent, height, cumulative work, status),
the best-chain tip, per-block undo records, named leases, the registry of pending messages, the
pruner's jobs and the recovery manager's claims; SQLite or PostgreSQL by URL."""

from stores.state.factory import open_state_store
from stores.state.protocol import (
    KEEP,
    PENDING_KINDS,
    BlockChange,
    BlockEntry,
    BlockStatus,
    Commitment,
    PendingDone,
    PendingEntry,
    PreparedDelta,
    Refusal,
    StateStore,
)
from stores.state.prunejobs import PruneJob, Requested

__all__ = [
    "KEEP", "PENDING_KINDS", "BlockChange", "BlockEntry", "BlockStatus", "Commitment", "PendingDone",
    "PendingEntry", "PreparedDelta", "PruneJob", "Refusal", "Requested", "StateStore", "open_state_store",
]
