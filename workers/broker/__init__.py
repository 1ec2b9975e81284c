"""The Redis broker as this project uses it: which run of the server a message went to
(`runs`), and the workarounds for kombu and Celery faults that would kill a worker (`kombu_fix`)."""
