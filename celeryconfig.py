"""Celery configuration: the one place for broker, serialization, queues, routes and acks.

Invariants:
- JSON only on the wire (pickle on a queue is remote code execution); messages carry ids —
  a block hash, a txid — never raw blocks or transactions, which wait in the blob store.
- The idempotent tasks acknowledge late and are rejected (so redelivered) when their worker
  dies; Redis's visibility timeout is longer than the longest task, so a slow task is not
  handed to a second worker while the first still runs.
- Each worker takes one message at a time (prefetch 1): a block task can run for seconds, and
  a prefetched message would wait behind it instead of going to an idle worker.
- Results are not stored: nothing reads them (`utxo wait` watches its own registry).
"""

from __future__ import annotations

from kombu import Queue

from workers.settings import load_settings

_settings = load_settings()

broker_url = _settings.broker_url
broker_connection_retry_on_startup = True
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
event_serializer = "json"

task_queues = [Queue(name) for name in ("blocks", "txs", "prune", "recovery")]
task_default_queue = "txs"
task_routes = {
    "utxoflow.block.*": {"queue": "blocks"},
    "utxoflow.tx.*": {"queue": "txs"},
    "utxoflow.prune.*": {"queue": "prune"},
    "utxoflow.recovery.*": {"queue": "recovery"},
}

task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
broker_transport_options = {"visibility_timeout": 3600}  # longer than any task (blocks: minutes)
task_ignore_result = True
worker_send_task_events = True  # Flower
task_send_sent_event = True
worker_hijack_root_logger = False
