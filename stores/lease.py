"""Who holds a lease, and when a lease may be taken from its holder: the one rule that creation
locks, the chain lease and the units of a block phase all follow.

A holder is named `host:pid:token` (the token tells apart several holders in one process). A
lease may be taken over when it has lapsed (its expiry has passed), or at once when its holder
is a process of this host that no longer runs. A holder on another host can only be waited
out: this host cannot see its processes.

Invariants:
- Taking over is only ever a matter of saving time: every lease here guards work that is
  idempotent, so a wrong judgement costs duplicate work, never wrong data.
- A zombie (killed, not yet reaped by its parent) counts as gone.
"""

from __future__ import annotations

import os
import socket
import uuid


def holder_id(token: str | None = None) -> str:
    """A holder name for this process: `host:pid:token` (a fresh token unless one is given)."""
    return f"{socket.gethostname()}:{os.getpid()}:{token or uuid.uuid4().hex[:8]}"


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)


def gone(host: str, pid: int) -> bool:
    """True when (host, pid) is a process of this host that no longer runs."""
    return host == socket.gethostname() and not process_alive(pid)


def holder_gone(holder: str | None) -> bool:
    """True when `holder` ("host:pid:…") is a process of this host that no longer runs."""
    host, _, rest = (holder or "").partition(":")
    pid = rest.partition(":")[0]
    return pid.isdigit() and gone(host, int(pid))


def lapsed(holder: str | None, expires_at_ms: int, now_ms: int) -> bool:
    """Whether a lease held by `holder` until `expires_at_ms` may be taken at `now_ms`."""
    return expires_at_ms <= now_ms or holder_gone(holder)
