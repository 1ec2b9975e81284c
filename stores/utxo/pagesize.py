"""A store's page size — outputs per record, UTXO_BATCH_SIZE — is fixed when the store is created:
it decides which record holds which output. Every backend records it in the store and, on
opening, uses the recorded one whatever it was asked for, so that readers and workers need not
know how the store was made; a differing request is a warning, never an error (the setting only
shapes new stores). One rule for every backend, here."""

from __future__ import annotations

import logging

log = logging.getLogger("utxoflow.store")
_warned: set[tuple[str, int, int]] = set()  # once per process: a worker opens its store often


def adopt(url_safe: str, recorded: int, requested: int) -> int:
    """The page size to use for the store at `url_safe`: the one it `recorded` when it was
    created (a warning, once per process, when it differs from the one `requested`)."""
    if recorded != requested and (url_safe, recorded, requested) not in _warned:
        _warned.add((url_safe, recorded, requested))
        log.warning("%s was created with UTXO_BATCH_SIZE=%d: that is used (the setting, %d, applies to "
                    "new stores only)", url_safe, recorded, requested)
    return recorded
