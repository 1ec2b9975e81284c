"""Blocks or transactions sent as `utxo enqueue` sends them (blob, registry, message), without its
checks at the door: for the tests of what the workers themselves refuse (a block invalid on its
own never gets past `utxo enqueue`). `python -m tests.pipeline.submit block|tx FILE`, run with a
pipeline's environment (tests.pipeline.workers.Pipeline.submit); FILE holds one hex item per line;
prints each one's hash."""

from __future__ import annotations

import sys
from pathlib import Path

from workers.runtime.ingest import submit_block, submit_tx


def main(kind: str, path: str) -> None:
    submit = submit_block if kind == "block" else submit_tx
    for line in Path(path).read_text().split():
        print(submit(bytes.fromhex(line)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
