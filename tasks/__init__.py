"""Thin Celery tasks: decode arguments, call a service in `workers/` or `stores/`, return small JSON.

The task modules arrive with the pipeline (queues `blocks`, `txs`, `prune`, `recovery`)."""
