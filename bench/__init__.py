"""Benchmarks, run as `python -m bench.NAME`; each prints its figures as one JSON object on its last line."""
