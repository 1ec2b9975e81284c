"""The blob store: raw blocks and external transactions by key, on a filesystem or S3.

`open_blob_store(url)` is the entry point; `file.py` and `s3.py` are the backends.
"""

from stores.blob.factory import open_blob_store
from stores.blob.protocol import KINDS, BlobNotFound, BlobStore, blob_key

__all__ = ["KINDS", "BlobNotFound", "BlobStore", "blob_key", "open_blob_store"]
