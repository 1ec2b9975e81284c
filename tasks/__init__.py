"""Thin Celery tasks: decode the message's ids, call a coordinator or store, return small JSON.
No business logic lives here (it is in `workers/` and `stores/`)."""
