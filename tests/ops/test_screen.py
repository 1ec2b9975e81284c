"""`utxo status`'s screen (workers/monitor/screen.py) from a snapshot: it says "at rest" only when
nothing is left to apply (issue 36: it said so with a lag of 18), and lists the last refusals."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from workers.monitor.screen import render


def shown(snap: dict[str, Any]) -> str:
    console = Console(record=True, width=160)
    console.print(render(snap))
    return console.export_text()


def snapshot(lag: int, applying: list[str]) -> dict[str, Any]:
    return {
        "at": 0, "errors": {}, "pending": {"block": 2},
        "chain": {"tip": {"height": 5, "hash": "ab" * 32}, "best_height": 5 + lag, "lag": lag,
                  "blocks": {"applied": 5}, "applying": applying, "disconnecting": None, "holder": None},
        "refused": {
            "blocks": [{"hash": "cd" * 32, "height": 6, "reason": "proof of work does not meet its bits"}],
            "txs": [{"key": "ef" * 32, "reason": "cannot spend", "kind": "tx"}],
        },
    }  # fmt: skip


def test_at_rest_only_with_nothing_left_to_apply() -> None:
    assert "at rest" in shown(snapshot(0, []))
    behind = shown(snapshot(18, []))
    assert "at rest" not in behind and "not applying now, blocks to apply" in behind
    assert "applying 1 block(s)" in shown(snapshot(18, ["ab" * 32]))


def test_the_last_refusals_are_listed() -> None:
    out = shown(snapshot(0, []))
    assert "refused" in out and "proof of work does not meet its bits" in out and "cannot spend" in out
