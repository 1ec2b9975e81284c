"""Celery configuration: the one place for broker, serialization, queues, routes and acks.

Invariants:
- JSON only on the wire (pickle on a queue is remote code execution); messages carry ids —
  a block hash, a txid — never raw blocks or transactions, which wait in the blob store.
- The idempotent tasks acknowledge late and are rejected (so redelivered) when their worker
  dies; Redis's visibility timeout is longer than the longest task, so a slow task is not
  handed to a second worker while the first still runs.
- Each worker takes one message at a time (prefetch 1): a block task can run for seconds, and
  a prefetched message would wait behind it instead of going to an idle worker.
- Results are not stored: nothing reads them (`utxo wait` watches its own registry, in the
  state store).
- Beat's schedule lives in memory only (`celery.beat:Scheduler`), never in a file: the default
  scheduler keeps it with shelve, that is pickle, which this project does not use anywhere.
"""

from __future__ import annotations

from kombu import Queue

from workers.broker.redisurl import for_kombu
from workers.settings import QUEUES as _QUEUES
from workers.settings import load_settings

_settings = load_settings()

# a Sentinel URL's primary name goes to kombu as a transport option (workers/broker/redisurl.py)
broker_url, _sentinel_options = for_kombu(_settings.broker_url)
broker_connection_retry_on_startup = True
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
event_serializer = "json"

task_queues = [Queue(name) for name in _QUEUES]
task_default_queue = "txs"
task_routes = {
    "utxoflow.block.*": {"queue": "blocks"},
    "utxoflow.tx.*": {"queue": "txs"},
    "utxoflow.chunk.*": {"queue": "txs"},  # block-phase helpers: any free worker (docs/architecture.md)
    "utxoflow.prune.*": {"queue": "prune"},
    "utxoflow.recovery.*": {"queue": "recovery"},
}

task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
broker_transport_options = {"visibility_timeout": 3600, **_sentinel_options}  # (longer than any task)
task_ignore_result = True
worker_send_task_events = True  # Flower
task_send_sent_event = True
worker_hijack_root_logger = False


# `utxo beat`. The in-memory scheduler (see above) forgets when each entry last ran when beat
# stops, which costs nothing here: every entry is a scan that is safe to run at any time, so a
# restarted beat simply runs it again one interval later.
beat_scheduler = "celery.beat:Scheduler"
beat_schedule = {
    "requeue-lost-messages": {  # workers/recovery/requeue.py
        "task": "utxoflow.recovery.requeue",
        "schedule": _settings.requeue_interval,
        # a scan left on the queue while every worker is busy is dropped once the next is due:
        # scans do not pile up behind long blocks
        "options": {"expires": _settings.requeue_interval},
    },
}
