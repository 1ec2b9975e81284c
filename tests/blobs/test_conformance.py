"""Conformance: the blob store's operations and failure behaviour (every backend)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from chain import parse_block
from stores.blob import BlobNotFound, BlobStore, blob_key, open_blob_store
from stores.errors import ProcessingError, StorageError
from tests.processes import race


def test_put_get_and_never_overwrite(blobs: BlobStore) -> None:
    assert blobs.put_if_absent("ab/one.tx", b"first")
    assert not blobs.put_if_absent("ab/one.tx", b"second")
    assert blobs.get("ab/one.tx") == b"first"
    assert blobs.exists("ab/one.tx") and not blobs.exists("ab/two.tx")


def test_many_at_once_as_one_at_a_time(blobs: BlobStore) -> None:
    """`put_many_if_absent`: each item as `put_if_absent` would, in their order — a key already
    there is left as it was (False), a new one written (True), a key twice in one call written
    once — and every blob readable whole once it returns."""
    assert blobs.put_many_if_absent([]) == []
    blobs.put_if_absent("m0/old.tx", b"old")
    items = [(f"m{k % 3}/{k:04x}.tx", bytes([k % 256]) * (k + 1)) for k in range(40)]
    twice = [("m1/twice.tx", b"a"), ("m1/twice.tx", b"b")]
    got = blobs.put_many_if_absent([("m0/old.tx", b"new"), *items, *twice])
    assert got[:41] == [False] + [True] * 40
    assert sorted(got[41:]) == [False, True]  # (which of the two: the backend's race)
    assert blobs.get("m0/old.tx") == b"old"
    assert all(blobs.get(k) == d for k, d in items)
    assert blobs.get("m1/twice.tx") in (b"a", b"b")
    assert blobs.put_many_if_absent(items[:3]) == [False] * 3


def test_many_at_once_again_after_a_directory_went(blobs: BlobStore, tmp_path: Path) -> None:
    """A shard directory removed behind the store's back (an operator's clean-up) is made again
    by the next write into it."""
    assert blobs.put_many_if_absent([("gone/a.tx", b"a"), ("gone/b.tx", b"b")]) == [True, True]
    if blobs.url.startswith("file://"):
        import shutil

        shutil.rmtree(Path(blobs.url.removeprefix("file://")) / "gone")
    else:
        blobs.delete("gone/a.tx")
        blobs.delete("gone/b.tx")
    assert blobs.put_many_if_absent([("gone/c.tx", b"c"), ("gone/d.tx", b"d")]) == [True, True]
    assert blobs.get("gone/c.tx") == b"c" and blobs.get("gone/d.tx") == b"d"


def test_ranged_reads(blobs: BlobStore) -> None:
    blobs.put_if_absent("r.block", bytes(range(100)))
    assert blobs.get("r.block", 10, 20) == bytes(range(10, 20))
    assert blobs.get("r.block", 90) == bytes(range(90, 100))
    assert blobs.get("r.block", 95, 200) == bytes(range(95, 100))
    assert blobs.get("r.block", 5, 5) == b""
    with pytest.raises(BlobNotFound):
        blobs.get("nothing.block", 1, 2)


def test_missing_blob_and_idempotent_delete(blobs: BlobStore) -> None:
    with pytest.raises(BlobNotFound) as e:
        blobs.get("cd/missing.tx")
    assert e.value.key == "cd/missing.tx" and e.value.code == "BLOB_NOT_FOUND"
    blobs.delete("cd/missing.tx")  # not an error
    blobs.put_if_absent("cd/there.tx", b"x")
    blobs.set_dah("cd/there.tx", 7)
    blobs.delete("cd/there.tx")
    assert not blobs.exists("cd/there.tx")
    assert blobs.put_if_absent("cd/there.tx", b"again")  # deleted means writable again
    assert blobs.get_dah("cd/there.tx") is None  # the mark went with the blob


def test_list_by_prefix(blobs: BlobStore) -> None:
    keys = ["aa/1.tx", "aa/2.outputs", "ab/3.block", "b.tx"]
    for k in keys:
        blobs.put_if_absent(k, k.encode())
    blobs.set_dah("aa/1.tx", 5)  # marks are not blobs
    assert sorted(blobs.list()) == sorted(keys)
    assert sorted(blobs.list("aa/")) == ["aa/1.tx", "aa/2.outputs"]
    assert sorted(blobs.list("a")) == ["aa/1.tx", "aa/2.outputs", "ab/3.block"]
    assert list(blobs.list("zz/")) == []


def test_delete_at_height_marks(blobs: BlobStore) -> None:
    blobs.put_if_absent("m.tx", b"m")
    assert blobs.get_dah("m.tx") is None
    blobs.set_dah("m.tx", 1000)
    assert blobs.get_dah("m.tx") == 1000
    blobs.set_dah("m.tx", 1200)
    assert blobs.get_dah("m.tx") == 1200
    blobs.set_dah("m.tx", None)
    assert blobs.get_dah("m.tx") is None
    assert blobs.get("m.tx") == b"m"
    with pytest.raises(BlobNotFound):
        blobs.set_dah("absent.tx", 5)
    with pytest.raises(BlobNotFound):
        blobs.get_dah("absent.tx")


def test_keys_are_checked(blobs: BlobStore) -> None:
    for bad in ("../escape.tx", "/abs.tx", ".hidden", "a//b.tx", "a/../b.tx", "sp ace.tx", ""):
        with pytest.raises(ProcessingError):
            blobs.put_if_absent(bad, b"x")
    assert list(blobs.list()) == []


def test_blob_keys_name_the_kind() -> None:
    h = bytes(range(32))
    assert blob_key(h, "tx") == f"{h[::-1].hex()[:2]}/{h[::-1].hex()}.tx"
    assert blob_key(h, "block").endswith(".block") and blob_key(h, "outputs").endswith(".outputs")
    with pytest.raises(ProcessingError):
        blob_key(h, "exe")


def test_a_real_block_round_trips(blobs: BlobStore, data_dir: Path) -> None:
    raw = (data_dir / "mainnet-413567.block").read_bytes()
    block = parse_block(raw)
    key = blob_key(block.hash, "block")
    assert blobs.put_if_absent(key, raw)
    assert blobs.get(key) == raw
    assert blobs.get(key, 0, 80) == raw[:80]
    assert parse_block(blobs.get(key)).hash == block.hash


def _racer(url: str, key: str, data: bytes, barrier: Any, out: Any) -> None:
    store = open_blob_store(url)
    barrier.wait(timeout=60)
    out.put((data, store.put_if_absent(key, data)))


def test_racing_writers_exactly_one_wins(blob_url: str, blobs: BlobStore) -> None:
    n = 4
    for round_ in range(3):
        key = f"race/{round_}.tx"
        datas = [bytes([w]) * 200_000 for w in range(n)]
        results = race(_racer, [(blob_url, key, d) for d in datas])
        winners = [d for d, won in results if won]
        assert len(winners) == 1
        assert blobs.get(key) == winners[0]


def test_a_server_that_is_down_is_a_storage_error_naming_the_key() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    store = open_blob_store(f"s3://utxoflow-down/p?endpoint_url=http://127.0.0.1:{port}&region=us-east-1")
    for call in (
        lambda: store.put_if_absent("ab/k.tx", b"x"),
        lambda: store.put_many_if_absent([("ab/k.tx", b"x"), ("ab/l.tx", b"y")]),
        lambda: store.get("ab/k.tx"),
        lambda: store.exists("ab/k.tx"),
    ):
        with pytest.raises(StorageError, match=r"ab/k\.tx"):
            call()


def test_an_unwritable_directory_is_a_storage_error_naming_the_key(tmp_path: Path) -> None:
    store = open_blob_store(f"file://{tmp_path}/blobs")
    (tmp_path / "blobs" / "ab").write_bytes(b"a file where a directory must go")
    with pytest.raises(StorageError, match=r"ab/k\.tx"):
        store.put_if_absent("ab/k.tx", b"x")
    with pytest.raises(StorageError, match=r"ab/k\.tx"):  # many at once: the others whole or absent
        store.put_many_if_absent([("cd/j.tx", b"w"), ("ab/k.tx", b"x"), ("ef/m.tx", b"z")])
    assert not store.exists("cd/j.tx") or store.get("cd/j.tx") == b"w"
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "blobs").rglob("*"))  # none left
    assert store.put_many_if_absent([("cd/j.tx", b"w"), ("ef/m.tx", b"z")]) in ([True, True], [False, True])


_DISK_FULL = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # a disk that fills after 4 KiB
from stores.blob import open_blob_store
from stores.errors import StorageError
store = open_blob_store(sys.argv[1])
try:
    store.put_if_absent("ab/big.block", b"x" * 100_000)
except StorageError as e:
    print("StorageError:", e)
    sys.exit(0)
sys.exit(1)
"""


def test_a_full_disk_leaves_nothing_half_written(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"file://{tmp_path}/blobs"
    root = str(Path(__file__).resolve().parents[2])  # this checkout's code, not an installed one
    done = subprocess.run(
        [sys.executable, "-c", _DISK_FULL, url], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": root}, cwd=root,
    )
    assert done.returncode == 0, done.stderr
    assert "ab/big.block" in done.stdout
    store = open_blob_store(url)
    assert not store.exists("ab/big.block")
    assert [p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == []  # no temp file left
    assert store.put_if_absent("ab/big.block", b"x" * 100_000)  # and the key is still free
