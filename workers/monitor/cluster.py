"""What the whole deployment holds right now, read from the state store and the broker: the
one snapshot both `utxo status` (for a person) and `utxo metrics` (for Prometheus) show.

Invariants: it only reads (one query per question, counts rather than rows), so any number of
`utxo status --watch` may run beside the workers; each source is read on its own, and one that
cannot be read is named in `errors` while the others are still shown — at 3 a.m. a Redis that is
down is itself the answer, not a reason to show nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from stores.sqldb import mask_url
from stores.state import BlockStatus, StateStore, open_state_store
from stores.state.prunejobs import PENDING, RUNNING
from workers.broker.kombu_fix import DEAD_LETTERS, DEAD_LETTERS_TOTAL
from workers.broker.redisurl import connect
from workers.broker.runs import is_redis
from workers.recovery.liveness import ALIVE, TAKEN, UNACKED, queue_keys
from workers.settings import QUEUES, Settings

REFUSALS_SHOWN = 5  # `utxo status`: the last refused blocks and transactions shown


def take(settings: Settings, window_s: int = 60) -> dict[str, Any]:
    out: dict[str, Any] = {"at": round(time.time(), 3), "errors": {}}
    try:
        state = open_state_store(settings.state_url, create=False)
    except Exception as e:
        out["errors"]["state"] = f"UTXO_STATE_URL ({mask_url(settings.state_url)}): {_line(e)}"
    else:
        try:
            out |= _from_state(state)
        except Exception as e:
            out["errors"]["state"] = _line(e)
        finally:
            state.close()
    if not is_redis(settings.broker_url):
        out["errors"]["broker"] = "the broker is not Redis: its queues cannot be read"
        return out
    try:
        r = connect(settings.broker_url, timeout=3)
    except ValueError as e:  # (a Sentinel URL that names no primary: said, not raised)
        out["errors"]["broker"] = f"UTXO_BROKER_URL ({mask_url(settings.broker_url)}): {_line(e)}"
        return out
    try:
        out |= _from_broker(r, window_s, settings.recovery_lease)
    except (redis.RedisError, OSError) as e:
        out["errors"]["broker"] = f"UTXO_BROKER_URL ({mask_url(settings.broker_url)}): {_line(e)}"
    finally:
        r.close()
    return out


def _line(e: BaseException) -> str:
    return " ".join((str(e) or type(e).__name__).split())


def _from_state(state: StateStore) -> dict[str, Any]:
    from workers.chainstate.batch import APPLYING
    from workers.chainstate.chainlease import LEASE
    from workers.chainstate.unwind import DISCONNECTING
    from workers.recovery.leader import shown_leader

    tip = state.tip()
    summary = state.block_summary()
    best_entry = state.best_candidate()  # (the best chain's end: a side branch's blocks are not ahead)
    best = None if best_entry is None else best_entry.height
    tip_height = None if tip is None else tip.height
    running, pending = state.prune_open_jobs()
    finished = next((j for j in state.prune_jobs(20) if j.status not in (PENDING, RUNNING)), None)
    rec = state.recovery_summary(0)
    return {
        "chain": {
            "tip": None if tip is None else {"height": tip.height, "hash": tip.hash[::-1].hex()},
            "best_height": best,
            # (no tip yet: every connected block is still to apply)
            "lag": summary.get(BlockStatus.PENDING.value, (0, None))[0] if tip_height is None or best is None
            else max(0, best - tip_height),
            "blocks": {s: n for s, (n, _h) in sorted(summary.items())},
            "applying": (state.get_meta(APPLYING) or "").split(),
            "disconnecting": state.get_meta(DISCONNECTING),
            "holder": state.lease_holder(LEASE),
        },
        "pending": state.pending_counts(),
        "waiting": _waiting(state),
        "refused": {  # the last refusals (`utxo wait` and `utxo tx` say more of one)
            "blocks": [e.to_json() for e in state.last_blocks(BlockStatus.INVALID, REFUSALS_SHOWN)],
            "txs": [r.to_json() for r in state.last_refusals(REFUSALS_SHOWN)],
        },
        "pruner": {
            "done_height": state.prune_done_height(),
            "running": None if running is None else running.to_json(),
            "pending": None if pending is None else pending.to_json(),
            "last": None if finished is None else finished.to_json(),
        },
        "recovery": {"leader": shown_leader(state), "states": rec["states"], "outcomes": rec["outcomes"]},
    }


def _waiting(state: StateStore) -> dict[str, Any]:
    """Pending messages that say what they wait for (a tx's missing parents): how many, and the
    ones waiting longest."""
    n, longest = state.waiting(None, REFUSALS_SHOWN)
    return {"count": n, "longest": [{"id": i, "reason": r, "since": round(t, 3)}
                                    for i, (r, t) in longest.items()]}


def queue_length(r: redis.Redis, name: str) -> int:
    """Messages waiting on queue `name` (every priority)."""
    pipe = r.pipeline(transaction=False)
    for key in queue_keys(name):
        pipe.llen(key)
    return sum(int(n) for n in pipe.execute())


def _from_broker(r: redis.Redis, window_s: int, lease_s: float) -> dict[str, Any]:
    from workers.ops.activity import rates

    now = time.time()
    unacked = {_text(t) for t in r.hkeys(UNACKED)}
    taken = {_text(k): _text(v) for k, v in r.hgetall(TAKEN).items()}
    holding: dict[str, int] = {}
    for tag in unacked:
        node = taken.get(tag)
        if node is not None:
            holding[node] = holding.get(node, 0) + 1
    workers = []
    keys = sorted(_text(k) for k in r.scan_iter(match=ALIVE + "*", count=500))
    for key, raw in zip(keys, r.mget(keys) if keys else []):
        if raw is None:  # (expired between the scan and the read)
            continue
        try:
            beat = json.loads(raw)
            ago = round(max(0.0, now - float(beat.get("at", now))), 1)
        except (ValueError, TypeError, AttributeError):  # not a heartbeat of ours: shown as such
            beat, ago = {}, None
        node = key[len(ALIVE):]
        workers.append({
            "node": node, "host": beat.get("host"), "pid": beat.get("pid"), "seen_s_ago": ago,
            # a heartbeat every third of the lease (workers/recovery/liveness.py): two missed
            "late": ago is None or ago > lease_s * 2 / 3,
            "holding": holding.get(node, 0),
        })
    return {
        "queues": {q: queue_length(r, q) for q in QUEUES},
        "unacked": len(unacked),
        # messages set aside rather than run (workers/broker/kombu_fix.py): listed now, and ever
        "dead_letters": int(r.llen(DEAD_LETTERS)),
        "dead_letters_total": int(r.get(DEAD_LETTERS_TOTAL) or 0),
        "workers": workers,
        "rates": {k: round(v, 3) for k, v in rates(r, window_s, now).items()},
        "window_s": window_s,
    }


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
