"""Progress on stderr: a rich display (spinner, bar, counts, rate) on a terminal, one plain log
line per finished step otherwise, so that logs stay readable when stderr is a file or a pipe."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    def step(self, description: str, total: int | None, unit: str) -> Iterator[Callable[[int], None]]:
        """Yields `advance(n)`; logs the step's count and rate when it ends without error."""
        task = self.progress.add_task(description, total=total, rate="")
        start = time.perf_counter()
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            done += n
            elapsed = time.perf_counter() - start
            fields: dict[str, Any] = {"rate": f"{_rate(done, elapsed)} {unit}/s" if elapsed > 0 else ""}
            self.progress.update(task, advance=n, **fields)

        yield advance
        elapsed = time.perf_counter() - start
        self.progress.update(task, total=done if total is None else total)
        if not self.interactive:
            rate = f" ({_rate(done, elapsed)} {unit}/s)" if elapsed > 0 else ""
            log(f"{description}: {done:,} {unit} in {elapsed:.2f} s{rate}")


def _rate(done: int, elapsed: float) -> str:
    """Whole numbers, but a decimal below 10 (2 workers in 4 s is 0.5/s, not 0/s)."""
    r = done / elapsed
    return f"{r:,.0f}" if r >= 10 else f"{r:.1f}"
