"""A blob store that tells listeners about its failures (a worker counts them in its metrics),
without the backends knowing who listens. Only `StorageError` is a failure: a blob that is not
there (`BlobNotFound`) is an answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from stores.blob.protocol import BlobNotFound, BlobStore
from stores.errors import StorageError

ErrorListener = Callable[[str, StorageError], None]
_listeners: list[ErrorListener] = []
OPS = ("put", "get", "exists", "delete", "list", "set_dah", "get_dah")  # what a listener is told


def on_error(listener: ErrorListener) -> None:
    """Call `listener(op, error)` on every failure of every blob store opened from now on."""
    if listener not in _listeners:
        _listeners.append(listener)


def off_error(listener: ErrorListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def observed(store: BlobStore) -> BlobStore:
    return ObservedBlobStore(store) if _listeners else store


class ObservedBlobStore:
    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner
        self.url = inner.url

    def _call(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except BlobNotFound:
            raise
        except StorageError as e:
            for listener in _listeners:
                try:
                    listener(op, e)
                except Exception:  # a listener never replaces the store's own error
                    pass
            raise

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return bool(self._call("put", self.inner.put_if_absent, key, data))

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        return list(self._call("put", self.inner.put_many_if_absent, items))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return bytes(self._call("get", self.inner.get, key, start, end))

    def exists(self, key: str) -> bool:
        return bool(self._call("exists", self.inner.exists, key))

    def delete(self, key: str) -> None:
        self._call("delete", self.inner.delete, key)

    def list(self, prefix: str = "") -> Iterator[str]:
        it = self._call("list", self.inner.list, prefix)
        while True:
            try:
                yield self._call("list", next, it)
            except StopIteration:
                return

    def set_dah(self, key: str, height: int | None) -> None:
        self._call("set_dah", self.inner.set_dah, key, height)

    def get_dah(self, key: str) -> int | None:
        v = self._call("get_dah", self.inner.get_dah, key)
        return None if v is None else int(v)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # a backend's own extras (tests' fault switches)
        return getattr(self.inner, name)
