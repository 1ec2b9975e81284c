"""S3-compatible blob store (`s3://BUCKET/PREFIX?endpoint_url=…&region=…`), through boto3.

Invariants:
- put_if_absent is one PUT with `If-None-Match: *`: the server refuses a second writer of a key
  (412), so of racing writers exactly one wins and nothing is ever overwritten; a single PUT is
  all-or-nothing, so no reader sees a partial blob.
- The delete-at-height mark is an object tag, which changes without rewriting the blob.
- Every failure other than "no such key" and "already there" is a StorageError naming the key.
Credentials come the boto3 way (environment, config files, instance roles).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from stores.blob.protocol import BlobNotFound, check_key
from stores.errors import StorageError

DAH_TAG = "delete_at_height"
PUT_THREADS = 16  # PUTs in flight at once in `put_many_if_absent` (a round trip each)
_MISSING = {"404", "NoSuchKey", "NotFound"}


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


class S3BlobStore:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an S3 blob URL (expected s3://BUCKET/PREFIX?…): {url}")
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint_url", "region"}
        if unknown:
            raise ValueError(f"unknown S3 URL parameter(s): {', '.join(sorted(unknown))}")
        self._s3: Any = boto3.client(
            "s3",
            endpoint_url=query.get("endpoint_url"),
            region_name=query.get("region"),
            config=Config(
                retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60,
                # `put_many_if_absent`'s PUTs, from up to AHEAD callers at once (`utxo enqueue tx`)
                max_pool_connections=PUT_THREADS * 3,
            ),
        )

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, key: str, action: str, e: Exception) -> StorageError:
        return StorageError(f"blob {key}: cannot {action} in s3://{self.bucket}/{self.prefix}: {e}")

    @contextmanager
    def _calling(self, key: str, action: str) -> Iterator[None]:
        """Map S3's answers: no such key → BlobNotFound; any other failure → StorageError."""
        try:
            yield
        except ClientError as e:
            if _code(e) in _MISSING:
                raise BlobNotFound(key) from None
            raise self._fail(key, action, e) from e
        except BotoCoreError as e:
            raise self._fail(key, action, e) from e

    def put_if_absent(self, key: str, data: bytes) -> bool:
        k = self._key(key)
        for attempt in range(5):
            try:
                self._s3.put_object(Bucket=self.bucket, Key=k, Body=data, IfNoneMatch="*")
                return True
            except ClientError as e:
                code = _code(e)
                if code in ("PreconditionFailed", "412"):
                    return False
                if code in ("ConditionalRequestConflict", "409") and attempt < 4:
                    time.sleep(0.05 * (attempt + 1))  # another writer's PUT is in flight
                    continue
                raise self._fail(key, "write", e) from e
            except BotoCoreError as e:
                raise self._fail(key, "write", e) from e
        raise AssertionError("unreachable")

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        # boto3's client is thread-safe: the PUTs overlap, each conditional as `put_if_absent`'s
        if len(items) < 2:
            return [self.put_if_absent(k, d) for k, d in items]
        with ThreadPoolExecutor(max_workers=min(PUT_THREADS, len(items))) as pool:
            return list(pool.map(lambda item: self.put_if_absent(*item), items))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        k = self._key(key)
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": k}
        if end is not None and end <= start:
            if not self.exists(key):
                raise BlobNotFound(key)
            return b""
        if start or end is not None:
            args["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            with self._calling(key, "read"):
                body: bytes = self._s3.get_object(**args)["Body"].read()
                return body
        except StorageError as e:
            if isinstance(e.__cause__, ClientError) and _code(e.__cause__) == "InvalidRange":
                return b""  # a range past the end: nothing there, as a file read gives
            raise

    def exists(self, key: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if _code(e) in _MISSING:
                return False
            raise self._fail(key, "look up", e) from e
        except BotoCoreError as e:
            raise self._fail(key, "look up", e) from e

    def delete(self, key: str) -> None:
        try:
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))  # missing: no error
        except (ClientError, BotoCoreError) as e:
            raise self._fail(key, "delete", e) from e

    def list(self, prefix: str = "") -> Iterator[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            paginator = self._s3.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    yield obj["Key"][len(base) :]
        except (ClientError, BotoCoreError) as e:
            raise self._fail(prefix or "*", "list", e) from e

    def set_dah(self, key: str, height: int | None) -> None:
        k = self._key(key)
        with self._calling(key, "mark"):
            if height is None:
                self._s3.delete_object_tagging(Bucket=self.bucket, Key=k)
            else:
                self._s3.put_object_tagging(
                    Bucket=self.bucket, Key=k,
                    Tagging={"TagSet": [{"Key": DAH_TAG, "Value": str(int(height))}]},
                )

    def get_dah(self, key: str) -> int | None:
        with self._calling(key, "read the mark of"):
            tags = self._s3.get_object_tagging(Bucket=self.bucket, Key=self._key(key))["TagSet"]
        for t in tags:
            if t["Key"] == DAH_TAG:
                return int(t["Value"])
        return None

    def close(self) -> None:
        self._s3.close()
