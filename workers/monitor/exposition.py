"""The deployment's snapshot (workers/monitor/cluster.py) as Prometheus metric families: what
`utxo metrics` serves, read afresh at every scrape. The worker processes' own counters and
histograms (workers/ops/metrics.py) are served by each worker; these are the gauges of shared
state that no single worker owns.

Invariant: a family is emitted whenever its source could be read, even with no samples, and
`utxoflow_up{source}` says which sources could not, so a panel over a down source shows "down",
not a stale or zero value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from workers.recovery.manager import COUNTED

SOURCES = ("state", "broker")


def families(snap: dict[str, Any]) -> Iterator[Metric]:
    up = GaugeMetricFamily("utxoflow_up", "Whether a source of the deployment could be read.",
                           labels=["source"])
    for s in SOURCES:
        up.add_metric([s], 0.0 if s in snap["errors"] else 1.0)
    yield up
    if "chain" in snap:
        yield from _state(snap)
    if "queues" in snap:
        yield from _broker(snap)


def _gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        yield GaugeMetricFamily(name, doc, value=float(value))


def _labelled(name: str, doc: str, label: str, values: dict[str, Any]) -> Metric:
    m = GaugeMetricFamily(name, doc, labels=[label])
    for k, v in sorted(values.items()):
        m.add_metric([k], float(v))
    return m


def _state(snap: dict[str, Any]) -> Iterator[Metric]:
    chain = snap["chain"]
    tip = chain["tip"]
    yield from _gauge("utxoflow_tip_height", "Height of the applied tip of the best chain.",
                      None if tip is None else tip["height"])
    yield from _gauge("utxoflow_best_height", "Highest height of a known block connected to the chain.",
                      chain["best_height"])
    yield from _gauge("utxoflow_chain_lag_blocks", "Known blocks of the best chain not applied yet.",
                      chain["lag"])
    yield _labelled("utxoflow_blocks", "Blocks known, by status.", "status", chain["blocks"])
    yield from _gauge("utxoflow_chain_applying_blocks", "Blocks being applied now (0: at rest).",
                      len(chain["applying"]))
    yield _labelled("utxoflow_pending_messages", "Messages enqueued and not finished, by kind.", "kind",
                    {"block": 0, "tx": 0} | snap["pending"])
    pr = snap["pruner"]
    yield from _gauge("utxoflow_pruner_done_height", "Highest height a completed pruner run covered.",
                      pr["done_height"])
    yield _labelled("utxoflow_pruner_open_jobs", "Pruner jobs waiting or running.", "status",
                    {"running": pr["running"] is not None, "pending": pr["pending"] is not None})
    last = pr["last"]
    if last is not None:
        fig = last.get("figures") or {}
        yield from _gauge("utxoflow_pruner_last_job_height", "Height of the last finished pruner job.",
                          last["height"])
        yield from _gauge("utxoflow_pruner_last_job_seconds", "Duration of the last finished pruner job.",
                          fig.get("seconds"))
        yield from _gauge("utxoflow_pruner_last_job_records_deleted", "Records the last pruner job deleted.",
                          (fig.get("delete") or {}).get("deleted", 0))
    rec = snap["recovery"]
    entries = GaugeMetricFamily("utxoflow_recovery_entries", "Recovery entries by kind and state.",
                                labels=["kind", "state"])
    for kind, states in sorted(rec["states"].items()):
        for st, n in sorted(states.items()):
            entries.add_metric([kind, st], float(n))
    yield entries
    outcomes = CounterMetricFamily("utxoflow_recovery_outcomes", "Recovery claims released, by kind "
                                   "and outcome (the whole deployment's count).", labels=["kind", "outcome"])
    counted = {(kind, oc): n for kind, counts in rec["outcomes"].items() for oc, n in counts.items()}
    for (kind, oc), n in sorted(({k: 0 for k in COUNTED} | counted).items()):  # (0 until it happens)
        outcomes.add_metric([kind, oc], float(n))
    yield outcomes
    leader = GaugeMetricFamily("utxoflow_recovery_leader_info", "The recovery manager leading now.",
                               labels=["instance"])
    if rec["leader"] is not None:
        leader.add_metric([str(rec["leader"].get("instance", ""))], 1.0)
    yield leader


def _broker(snap: dict[str, Any]) -> Iterator[Metric]:
    yield _labelled("utxoflow_queue_messages", "Messages waiting on a queue (Redis LLEN).", "queue",
                    snap["queues"])
    yield from _gauge("utxoflow_queue_unacked_messages", "Messages taken by a worker, not acknowledged.",
                      snap["unacked"])
    yield from _gauge("utxoflow_dead_letters", "Messages workers set aside rather than run, listed now "
                      "(utxo dead-letters).", snap["dead_letters"])
    yield from _gauge("utxoflow_dead_letters_seen", "Messages workers ever set aside rather than run.",
                      snap["dead_letters_total"])
    workers = snap["workers"]
    yield from _gauge("utxoflow_workers_alive", "Workers whose liveness key is current.", len(workers))
    yield _labelled("utxoflow_worker_holding_messages", "Unacknowledged messages each live worker holds.",
                    "node", {w["node"]: w["holding"] for w in workers})
    yield _labelled("utxoflow_recent_rate_per_second", "What the workers did over the last minute, per "
                    "second (blocks, block_txs, mempool_txs).", "kind", snap["rates"])


class SnapshotCollector:
    """A prometheus_client collector that takes a snapshot at each scrape."""

    def __init__(self, take: Callable[[], dict[str, Any]]) -> None:
        self.take = take

    def collect(self) -> Iterator[Metric]:
        yield from families(self.take())

    def describe(self) -> list[Metric]:
        return []  # (no read at registration: the sources may be down then)
