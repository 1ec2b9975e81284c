"""Celery configuration: the one place for broker, serialization, queues and routes.

Invariants: JSON only on the wire (pickle on a queue is remote code execution); messages carry
ids, never raw blocks or transactions. The tasks and the beat schedule arrive with the pipeline.
"""

from __future__ import annotations

import os

from kombu import Queue

broker_url = os.environ.get("UTXO_BROKER_URL", "redis://127.0.0.1:6379/0")
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
event_serializer = "json"
task_queues = [Queue(name) for name in ("blocks", "txs", "prune", "recovery")]
task_default_queue = "txs"
task_ignore_result = True  # results are stored only where something reads them
