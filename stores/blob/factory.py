"""Open a blob store by URL (`file://PATH`, `s3://BUCKET/PREFIX?endpoint_url=…&region=…`);
backends are imported lazily, so boto3 is needed only by those who use S3."""

from __future__ import annotations

import importlib

from stores.blob.observed import observed
from stores.blob.protocol import BlobStore

BACKENDS: dict[str, str] = {
    "file": "stores.blob.file:FileBlobStore",
    "s3": "stores.blob.s3:S3BlobStore",
}


def open_blob_store(url: str) -> BlobStore:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    target = BACKENDS.get(scheme)
    if target is None:
        raise ValueError(f"unknown blob store URL scheme {scheme or url!r} (known: {', '.join(BACKENDS)})")
    module, cls = target.split(":")
    store: BlobStore = getattr(importlib.import_module(module), cls)(url)
    return observed(store)
