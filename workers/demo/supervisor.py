"""Child processes that must not outlive the command that started them (`utxo demo`).

Invariants:
- Every child runs in a process group of its own (a new session), so that stopping it reaches
  whatever it forked (a Celery worker's pool), and a Ctrl-C at the terminal reaches only the
  parent, which then stops the children in order (workers before the Redis they use).
- A child is registered before a signal can interrupt its parent's bookkeeping: SIGINT and
  SIGTERM that arrive while it is started are held and acted on right after (a child gets the
  default handlers back when it executes its program).
- `stop` ends every group: SIGTERM, then SIGKILL to any group that still has a member after
  the timeout (a group outlives its leader when the leader dies before its children). On
  Linux a child is also sent SIGKILL by the kernel if the parent dies without stopping it.
- SIGTERM to the parent behaves as Ctrl-C does (KeyboardInterrupt), so `finally` blocks run.
- A stop signal is noted as well as raised: Python swallows an exception raised while a
  finalizer runs (a redis-py pool's `__del__`, printed as "Exception ignored"), so the parent's
  waits ask `pause`, which raises again what was noted, and a swallowed Ctrl-C still stops it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[[int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn: Callable[[int, int], int] = libc.prctl
        return fn
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


_prctl = _load_prctl()  # loaded before any fork: the child only calls it


def _child_setup() -> None:
    """Runs in the child between fork and exec: be killed when the parent dies."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@contextmanager
def signals_held(act_after: bool = True) -> Iterator[None]:
    """SIGINT and SIGTERM arriving inside are held; the first is acted on when leaving (its
    previous handler runs), or dropped with act_after=False. Python-level handlers, not a
    signal mask: with other threads running (rich's refresh), a masked signal goes to them."""
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    try:
        with _stop_handlers(hold) as old:
            yield
    finally:
        if held and act_after:
            prev = old[signal.Signals(held[0])]
            if callable(prev):
                prev(held[0], None)
            elif prev == signal.SIG_DFL:
                os.kill(os.getpid(), held[0])


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def group_alive(self) -> bool:
        """Whether any process of its group is left (the leader may be gone, a fork not)."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a member we may not signal: it exists
            return True
        return True

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self, lines: int = 1) -> str:
        """The last lines of its log (for an error message naming why it stopped)."""
        if self.log is None or not self.log.is_file():
            return ""
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])


class Supervisor:
    def __init__(self) -> None:
        self.children: list[Child] = []

    def start(
        self, name: str, argv: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path | None = None
    ) -> Child:
        """Start `argv` in a new session, its stdout and stderr to `log` (else discarded)."""
        out: IO[bytes] | int = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            with signals_held():
                proc = subprocess.Popen(
                    list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_child_setup,
                )
                child = Child(name, proc, log)
                self.children.append(child)
        finally:
            if not isinstance(out, int):
                out.close()
        return child

    def stop(self, children: Sequence[Child] | None = None, timeout: float = 10.0) -> None:
        """SIGTERM to each group, wait up to `timeout` s for all, then SIGKILL what is left.
        A Ctrl-C meanwhile is dropped: stopping is what it asks for, and is under way."""
        todo = list(self.children if children is None else children)
        with signals_held(act_after=False):
            for c in todo:
                if c.alive() or c.group_alive():
                    c.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for c in todo:
                try:
                    c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            while time.monotonic() < deadline and any(c.group_alive() for c in todo):
                time.sleep(0.05)  # leaders are gone; their forks are finishing
            for c in todo:
                if c.alive() or c.group_alive():
                    c.signal_group(signal.SIGKILL)
            for c in todo:
                c.proc.wait()
            reaped = time.monotonic() + 5
            while time.monotonic() < reaped and any(c.group_alive() for c in todo):
                time.sleep(0.02)  # forks whose leader is gone are reaped by init
            self.children = [c for c in self.children if c not in todo]


_noted: list[str] = []  # the stop signals received inside `interrupts`, by name


def _interrupted(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    _noted.append(name)
    raise KeyboardInterrupt(name)


@contextmanager
def interrupts() -> Iterator[None]:
    """Inside: SIGINT and SIGTERM raise KeyboardInterrupt naming the signal (so cleanup runs),
    and are noted for `pause` (see the module)."""
    _noted.clear()
    with _stop_handlers(_interrupted):
        yield


@contextmanager
def _stop_handlers(handler: Callable[[int, FrameType | None], None]) -> Iterator[dict[signal.Signals, Any]]:
    """`handler` for SIGINT and SIGTERM inside, the previous ones (yielded) put back on leaving."""
    old = {s: signal.signal(s, handler) for s in _STOP_SIGNALS}
    try:
        yield old
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def pause(seconds: float) -> None:
    """Sleep, unless a stop signal was noted (one whose KeyboardInterrupt may have been
    swallowed): then raise it again."""
    if _noted:
        raise KeyboardInterrupt(_noted[0])
    time.sleep(seconds)
    if _noted:
        raise KeyboardInterrupt(_noted[0])
