"""Thin Celery tasks: decode the message's ids, call a coordinator or store, return small JSON.
No business logic lives here (it is in `workers/` and `stores/`)."""


class Refused(Exception):
    """The message's block or transaction was refused (its reason logged in the state store):
    raised as its task's end so that Celery records the task as failed, and Flower lists it so,
    with the reason, instead of as a success. Tasks name it in `throws`: an expected outcome,
    logged in one line without a traceback, and the message acknowledged (not retried)."""
