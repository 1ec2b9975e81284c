"""The `utxo` command line (CONTRACT.md): `workers.cli:main` is the console script.

Modules: `app` (the group, global options, errors → exit codes, output), `query` (config, tx,
outpoint, utxos, stats), `snapshot` (import-utxos), `export` (export-utxos), `pipeline` (worker,
beat, wait, tip, block, flower), `enqueue`, `prune`, `recover`, `status` (status, metrics),
`verdicts` (invalidate, reconsider), `demo`, `progress` (stderr progress).
"""

from workers.cli import demo, enqueue, export, pipeline, prune, query, recover, snapshot, status, verdicts  # noqa: F401  (registers the commands)
from workers.cli.app import cli, main

__all__ = ["cli", "main"]
