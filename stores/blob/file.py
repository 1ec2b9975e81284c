"""Filesystem blob store (`file://PATH`, the default).

Invariants:
- A blob is written to a temporary file in its final directory, flushed to disk, then hard-linked
  to its key. A link never replaces an existing name, so a key is written once, atomically: a
  reader sees the whole blob or nothing, and of racing writers exactly one link succeeds.
- Temporary files and marks live under names no key can take (they start with a dot), so a
  crash leaves at worst a stray temporary file, never a partial blob under a key.
"""

from __future__ import annotations

import os
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import TypeVar

from stores.blob.protocol import BlobNotFound, check_key
from stores.errors import StorageError

PREFIX = "file://"
MARKS = ".dah"
T = TypeVar("T")
FLUSH_THREADS = 16  # disk flushes in flight at once in `put_many_if_absent`


_STORES: weakref.WeakSet[FileBlobStore] = weakref.WeakSet()  # this process's, for `_after_fork`


def _after_fork() -> None:
    for store in list(_STORES):
        store._forked()


os.register_at_fork(after_in_child=_after_fork)


class FileBlobStore:
    def __init__(self, url: str) -> None:
        if not url.startswith(PREFIX) or len(url) == len(PREFIX):
            raise ValueError(f"not a file blob URL (expected {PREFIX}PATH): {url}")
        self.url = url
        self.root = Path(url[len(PREFIX) :])
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create blob directory {self.root}: {e}") from e
        # the flushing threads of `put_many_if_absent`, started once per process: a forked
        # child (a worker's pool) has none of its parent's threads, so it starts its own
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._pool_lock = threading.Lock()  # (callers in several threads: `utxo enqueue tx`)
        _STORES.add(self)
        self._made: set[Path] = set()  # directories this process knows exist

    def _forked(self) -> None:
        """In a forked child: none of the parent's threads, and its lock may have been held."""
        self._pool, self._pool_lock = None, threading.Lock()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _mark(self, key: str) -> Path:
        return self.root / MARKS / f"{check_key(key)}.dah"

    def _fail(self, key: str, action: str, e: OSError) -> StorageError:
        return StorageError(f"blob {key}: cannot {action} in {self.root}: {e.strerror or e}")

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if path.exists():
            return False
        tmp: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            _fsync_dir(path.parent)
            return True
        except OSError as e:
            raise self._fail(key, "write", e) from e
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                except OSError as e:  # the blob itself is whole; a stray temp file is harmless
                    raise self._fail(key, "remove a temporary file", e) from e

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """As `put_if_absent` for each, overlapped in threads (a flush waits on the disk, not the
        CPU; the filesystem commits flushes that come together at once): each blob written to a
        temporary file, flushed and closed in one thread's step (so at most a thread's worth of
        files is open); then each linked to its key; then each directory that got a link, or
        was made, flushed once. A temporary file is always removed (a stray one, were removing
        it to fail, is harmless: no key can take its name)."""
        out = [False] * len(items)
        todo = [(i, key, self._path(key), data) for i, (key, data) in enumerate(items)]
        todo = [t for t in todo if not t[2].exists()]
        temps: list[tuple[int, str, Path, str]] = []  # (position, key, the key's path, temporary)
        try:
            calls = [(key, partial(self._temp, path, data)) for _i, key, path, data in todo]
            written = self._overlapped(calls, "write")
            temps = [(i, key, path, tmp) for (i, key, path, _d), tmp in zip(todo, written)]
            dirs: dict[Path, str] = {}
            for i, key, path, tmp in temps:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    continue
                except OSError as e:
                    raise self._fail(key, "write", e) from e
                out[i] = True
                dirs.setdefault(path.parent, key)
            self._overlapped([(key, partial(_fsync_dir, d)) for d, key in dirs.items()], "publish")
            return out
        finally:
            for *_, tmp in temps:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _temp(self, path: Path, data: bytes) -> str:
        """`data` in a new temporary file beside `path`, flushed to disk and closed; its name."""
        if path.parent not in self._made:
            made = not path.parent.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            if made:  # a new shard directory: its name in the root is durable too
                _fsync_dir(self.root)
            self._made.add(path.parent)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        except FileNotFoundError:  # removed since this process made it: make it again
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def _overlapped(self, calls: Sequence[tuple[str, Callable[[], T]]], action: str) -> list[T]:
        """Each (key, call) in the process's threads, every one waited for, their results in
        order; the first OSError (in order) is the StorageError naming its key."""
        if len(calls) < 2:
            results = []
            for key, call in calls:
                try:
                    results.append(call())
                except OSError as e:
                    raise self._fail(key, action, e) from e
            return results
        with self._pool_lock:
            if self._pool is None or self._pool[0] != os.getpid():
                self._pool = (os.getpid(), ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="blob-flush"))
            pool = self._pool[1]
        futures = [pool.submit(call) for _key, call in calls]
        wait(futures)  # every one ends before a failure is told (the caller cleans up after them)
        done: list[T] = []
        failure: StorageError | None = None
        for (key, _call), f in zip(calls, futures):
            error = f.exception()
            if error is None:
                done.append(f.result())
            elif isinstance(error, OSError):
                failure = failure or self._fail(key, action, error)
            else:
                raise error
        if failure is not None:
            for tmp in done:  # what the others wrote: no key names it
                if isinstance(tmp, str) and action == "write":
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
            raise failure
        return done

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if start:
                    f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            raise BlobNotFound(key) from None
        except OSError as e:
            raise self._fail(key, "read", e) from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        for p in (self._path(key), self._mark(key)):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise self._fail(key, "delete", e) from e

    def list(self, prefix: str = "") -> Iterator[str]:
        start = self.root
        if "/" in prefix:
            start = self.root / prefix.rsplit("/", 1)[0]
        if not start.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith("."):
                    continue
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix):
                    yield key

    def set_dah(self, key: str, height: int | None) -> None:
        if not self.exists(key):
            raise BlobNotFound(key)
        mark = self._mark(key)
        try:
            if height is None:
                mark.unlink(missing_ok=True)
                return
            mark.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=mark.parent)
            with os.fdopen(fd, "w") as f:
                f.write(str(int(height)))
            os.replace(tmp, mark)  # a mark may change, so it is replaced, atomically
        except OSError as e:
            raise self._fail(key, "mark", e) from e

    def get_dah(self, key: str) -> int | None:
        try:
            return int(self._mark(key).read_text())
        except FileNotFoundError:
            if not self.exists(key):
                raise BlobNotFound(key) from None
            return None
        except OSError as e:
            raise self._fail(key, "read the mark of", e) from e

    def close(self) -> None:
        if self._pool is not None and self._pool[0] == os.getpid():
            self._pool[1].shutdown(wait=True)
        self._pool = None


def _fsync_dir(path: Path) -> None:
    """Make a new directory entry durable (the link that publishes a blob)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
