"""The `utxo status` screen: the deployment's snapshot (workers/monitor/cluster.py) as one rich
table a terminal shows at a glance. Layout only: every figure is the snapshot's."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text


def _n(v: Any) -> str:
    return "—" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def _rate(v: float) -> str:
    return f"{v:,.0f}/s" if v >= 10 else f"{v:.2f}/s"


def _short(h: str) -> str:
    return f"{h[:8]}…{h[-8:]}"


def render(snap: dict[str, Any]) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column()
    if "chain" in snap:
        _chain(grid, snap)
    if "queues" in snap:
        _broker(grid, snap)
    if "pruner" in snap:
        _pruner(grid, snap["pruner"])
        _recovery(grid, snap["recovery"])
    for source, err in snap["errors"].items():
        grid.add_row(Text("error", style="bold red"), Text(f"{source}: {err}", style="red"))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snap["at"]))
    return Group(Text(f"utxoflow · {stamp}", style="bold"), grid)


def _chain(grid: Table, snap: dict[str, Any]) -> None:
    c = snap["chain"]
    tip = c["tip"]
    lag = c["lag"] or 0
    line = Text()
    line.append("tip ")
    line.append("none yet" if tip is None else f"{tip['height']:,} {_short(tip['hash'])}", style="bold")
    line.append(f"   best {_n(c['best_height'])}   lag ")
    line.append(f"{lag:,} blocks", style="bold red" if lag > 1 else "bold green")
    grid.add_row("chain", line)
    blocks = "  ".join(f"{k} {v:,}" for k, v in c["blocks"].items()) or "none"
    if c["applying"]:
        doing = f"applying {len(c['applying'])} block(s)"
    elif lag:  # (between two passes, or nobody holds the chain: the recovery manager takes it up)
        doing = "not applying now, blocks to apply"
    else:
        doing = "at rest"
    if c["disconnecting"]:
        doing = f"disconnecting {_short(bytes.fromhex(c['disconnecting'])[::-1].hex())}"
    holder = f" by {c['holder']}" if c["holder"] else ""
    grid.add_row("", f"blocks: {blocks}   {doing}{holder}")
    pending = snap["pending"]
    grid.add_row("pending", f"blocks {pending.get('block', 0):,}   txs {pending.get('tx', 0):,}"
                            "   (enqueued, not finished)")
    waiting = snap.get("waiting") or {}
    for k, w in enumerate(waiting.get("longest", [])):  # the longest waiting first
        head = f"waiting ({waiting['count']:,})" if k == 0 else ""
        grid.add_row(head, Text(f"{_short(w['id'].partition(':')[2])}: {w['reason']}"[:160], style="cyan"))
    refused = snap.get("refused") or {}
    said = [f"block {_short(b['hash'])} at {_n(b['height'])}: {b.get('reason', '')}"
            for b in refused.get("blocks", [])]
    said += [f"tx {_short(t['key'])}: {t['reason']}" for t in refused.get("txs", [])]
    for k, text in enumerate(said):  # the newest of each kind first
        grid.add_row("refused" if k == 0 else "", Text(text[:160], style="yellow"))


def _broker(grid: Table, snap: dict[str, Any]) -> None:
    r = snap["rates"]
    grid.add_row(f"rates ({snap['window_s']} s)",
                 f"blocks {_rate(r['blocks'])}   block txs {_rate(r['block_txs'])}   "
                 f"mempool txs {_rate(r['mempool_txs'])}")
    queues = "   ".join(f"{q} {n:,}" for q, n in snap["queues"].items())
    grid.add_row("queues", f"{queues}   unacked {snap['unacked']:,}")
    if snap.get("dead_letters"):
        grid.add_row("", Text(f"{snap['dead_letters']:,} message(s) set aside (utxo dead-letters)",
                              style="yellow"))
    workers = snap["workers"]
    if not workers:
        grid.add_row("workers", Text("none seen (no liveness key is current)", style="yellow"))
    for k, w in enumerate(workers):
        seen = "?" if w["seen_s_ago"] is None else f"{w['seen_s_ago']:.0f}"
        text = Text(f"{w['node']} ({w['host']} pid {w['pid']})  seen {seen} s ago  "
                    f"holding {w['holding']}" + ("  late" if w["late"] else ""),
                    style="yellow" if w["late"] else "")
        grid.add_row("workers" if k == 0 else "", text)


def _pruner(grid: Table, p: dict[str, Any]) -> None:
    parts = [f"done to {_n(p['done_height'])}"]
    for what in ("running", "pending"):
        j = p[what]
        if j is not None:
            parts.append(f"{what} job {j['id']} (height {j['height']:,})")
    last = p["last"]
    if last is not None:
        fig = last.get("figures") or {}
        deleted = (fig.get("delete") or {}).get("deleted", 0)
        parts.append(f"last job {last['id']} {last['status']}: {deleted:,} records in "
                     f"{fig.get('seconds', 0):.1f} s" + (f" ({last['error']})" if last.get("error") else ""))
    grid.add_row("pruner", "   ".join(parts))


def _recovery(grid: Table, r: dict[str, Any]) -> None:
    leader = r["leader"]
    states = "  ".join(f"{kind} {st} {n:,}" for kind, sts in r["states"].items() for st, n in sts.items())
    grid.add_row("recovery", f"leader {leader['instance'] if leader else 'none'}   "
                             f"entries: {states or 'none'}")
