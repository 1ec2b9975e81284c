"""Open the state store by URL (`sqlite:///PATH`, `postgresql://…`)."""

from __future__ import annotations

from stores.state.protocol import StateStore


def open_state_store(url: str, *, create: bool = True) -> StateStore:
    from stores.state.sql import SqlStateStore

    return SqlStateStore(url, create=create)
