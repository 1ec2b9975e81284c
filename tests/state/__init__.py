"""The state store conformance suite: block index, tip, undo records and leases, every test on
SQLite and on PostgreSQL."""
