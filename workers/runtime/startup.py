"""What a worker checks before it consumes a single message: that each store its settings name
can be opened (and closed again: the pool's children open their own after the fork).

Invariants:
- A store URL that cannot work (an unknown scheme, options the store refuses), or a broker URL
  that cannot, stops the worker before it takes anything off a queue: taking messages it can
  only fail would starve the workers that can apply them.
- A store that cannot be reached yet (a server starting, a database not created yet) is waited
  for, with a line in the log every few seconds and nothing consumed, for `UTXO_STORE_WAIT`
  seconds; then the worker refuses to start too. The error names the setting. (A refused
  connection and wrong credentials look alike to the driver: both are waited for.)
- Then the UTXO store and the state store must belong together (`workers.chainstate.pairing`): a worker
  on a mistyped UTXO_STORE_URL would find every block's inputs missing and refuse the chain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from stores.blob import open_blob_store
from stores.errors import StorageError, StoreError
from stores.sqldb import mask_url
from stores.state import open_state_store
from stores.utxo import open_utxo_store
from workers.settings import Settings

log = logging.getLogger("utxoflow.worker")
LOG_EVERY = 5.0  # seconds between the lines that say a worker still waits for a store


class CannotStart(ValueError):
    """A store named by the settings cannot be used; the message names the setting."""


def check_stores(s: Settings) -> None:
    """Open and close each store of `s` (the blob store first: the UTXO store opens it too),
    waiting up to `s.store_wait` seconds for one that cannot be reached yet; before them, the
    broker URL must be one that can work (workers.broker.runs.broker_error: Celery would fail on it
    only once started, with a traceback, or retry for ever on a database Redis refuses)."""
    from workers.broker.runs import broker_error

    error = broker_error(s.broker_url)
    if error is not None:
        raise CannotStart(error)
    openers: list[tuple[str, str, Callable[[], Any]]] = [
        ("UTXO_BLOB_URL", s.blob_url, lambda: open_blob_store(s.blob_url)),
        ("UTXO_STATE_URL", s.state_url, lambda: open_state_store(s.state_url)),
        ("UTXO_STORE_URL", s.store_url, lambda: open_utxo_store(s.store_url, **s.store_options())),
    ]
    deadline = time.monotonic() + s.store_wait
    for setting, url, opener in openers:
        said = 0.0
        while True:
            try:
                opener().close()
                break
            except StorageError as e:  # not reachable (yet)
                why = first_line(e)
                if time.monotonic() >= deadline:
                    raise CannotStart(f"{setting} ({mask_url(url)}) could not be reached in "
                                      f"{s.store_wait:g} s: {why}") from e
                if time.monotonic() - said >= LOG_EVERY:
                    said = time.monotonic()
                    log.warning("waiting for %s (%s) before taking any message: %s",
                                setting, mask_url(url), why)
                time.sleep(0.5)
            except (StoreError, ValueError) as e:  # an unknown scheme, options refused: never works
                raise CannotStart(f"{setting} ({mask_url(url)}) cannot work: {first_line(e)}") from e
    problem = paired(s)
    if problem is not None:
        raise CannotStart(problem)


def paired(s: Settings) -> str | None:
    """Why the stores of `s` do not belong together (pairing them on first start), or None."""
    from workers.chainstate.pairing import apart

    state = open_state_store(s.state_url)
    try:
        utxo = open_utxo_store(s.store_url, **s.store_options())
        try:
            return apart(state, utxo, pair=True)
        finally:
            utxo.close()
    except StorageError as e:
        why = first_line(e)
        raise CannotStart(f"checking that UTXO_STORE_URL and UTXO_STATE_URL belong together: {why}") from e
    finally:
        state.close()


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]

