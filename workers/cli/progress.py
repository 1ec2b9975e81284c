"""Progress on stderr: a rich display (spinner, bar, counts, rate, time left) on a terminal, plain
log lines otherwise, so that logs stay readable when stderr is a file or a pipe: one per finished
step, and, for a step that asks for them (`every`), one every so often while it runs."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from types import TracebackType
from typing import Any

from workers.cli.app import log


class Reporter:
    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True)
        self.interactive = self.console.is_terminal
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.interactive,
        )

    def __enter__(self) -> Reporter:
        self.progress.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    @contextmanager
    def step(
        self, description: str, total: int | None, unit: str, every: float | None = None,
        detail: Callable[[], str] | None = None,
    ) -> Iterator[Callable[[int], None]]:
        """Yields `advance(n)` (n may be 0: the time passes); logs the step's count and rate when
        it ends without error, and with `every`, when stderr is no terminal, a line of progress
        (done, pending, rate, time left, and `detail()` where it says something) at the first
        advance and then at most every `every` seconds."""
        task = self.progress.add_task(description, total=total, rate="")
        start = time.perf_counter()
        last = start - (every or 0.0)  # the first advance says where the step starts
        done = 0

        def advance(n: int) -> None:
            nonlocal done, last
            done += n
            now = time.perf_counter()
            elapsed = now - start
            fields: dict[str, Any] = {"rate": f"{_rate(done, elapsed)} {unit}/s" if elapsed > 0 else ""}
            self.progress.update(task, advance=n, **fields)
            if every is not None and not self.interactive and now - last >= every:
                last = now
                more = detail() if detail is not None and done != total else ""
                log(f"{description}: {_so_far(done, total, unit, elapsed)}{'; ' + more if more else ''}")

        yield advance
        elapsed = time.perf_counter() - start
        self.progress.update(task, total=done if total is None else total)
        if not self.interactive:
            rate = f" ({_rate(done, elapsed)} {unit}/s)" if elapsed > 0 else ""
            of = f" of {total:,}" if total is not None and done != total else ""
            log(f"{description}: {done:,}{of} {unit} in {elapsed:.2f} s{rate}")


class WaitProgress:
    """`utxo wait`'s progress: a step per kind of message waited for (blocks, txs), counted from
    the ids the registry reports still waited for (workers.runtime.registry.Registry.wait).
    `why(kind)`, asked only when a plain line is logged, says what those of a kind wait for."""

    EVERY_S = 10.0  # seconds between plain progress lines (stderr no terminal)

    def __init__(self, rep: Reporter, why: Callable[[str], str] | None = None) -> None:
        self.rep = rep
        self.why = why
        self.steps: list[ExitStack] = []  # one per kind: closed in the order they were opened
        self.totals: dict[str, int] | None = None
        self.done: dict[str, int] = {}
        self.advance: dict[str, Callable[[int], None]] = {}

    def __enter__(self) -> WaitProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        for step in self.steps:
            step.close()

    def __call__(self, waiting: list[str]) -> None:
        left = Counter(ident.partition(":")[0] for ident in waiting)
        if self.totals is None:  # the first report: everything waited for
            self.totals = dict(left)
            for kind, n in sorted(left.items()):
                self.done[kind] = 0
                self.steps.append(ExitStack())
                detail = None if self.why is None else partial(self.why, kind)
                self.advance[kind] = self.steps[-1].enter_context(
                    self.rep.step("wait", n, f"{kind}s", every=self.EVERY_S, detail=detail))
        for kind, total in self.totals.items():
            now = total - left.get(kind, 0)
            self.advance[kind](now - self.done[kind])
            self.done[kind] = now


def _so_far(done: int, total: int | None, unit: str, elapsed: float) -> str:
    """`12 of 40 blocks done, 28 pending, 3.1 blocks/s, ETA 9 s`."""
    rate = done / elapsed if elapsed > 0 else 0.0
    if total is None:
        return f"{done:,} {unit} done, {_rate(done, elapsed)} {unit}/s"
    left = total - done
    eta = f"{left / rate:,.0f} s" if rate > 0 else "unknown"
    return f"{done:,} of {total:,} {unit} done, {left:,} pending, {_rate(done, elapsed)} {unit}/s, ETA {eta}"


def _rate(done: int, elapsed: float) -> str:
    """Whole numbers, but a decimal below 10 (2 workers in 4 s is 0.5/s, not 0/s)."""
    r = done / elapsed if elapsed > 0 else 0.0
    return f"{r:,.0f}" if r >= 10 else f"{r:.1f}"
