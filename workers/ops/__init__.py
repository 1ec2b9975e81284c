"""The instruments every process records with: Prometheus metrics (and their multiprocess
directory), recent activity counts in Redis, and JSON log lines."""
