"""The blob store conformance suite: every test runs on the filesystem and on S3 (moto's server)."""
