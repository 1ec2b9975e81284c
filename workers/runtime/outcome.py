"""How a task ends when its message was refused: below the tasks, so that the worker's hooks
(`workers.hooks`) can tell a refusal from a failure without importing the tasks."""

from __future__ import annotations


class Refused(Exception):
    """The message's block or transaction was refused (its reason logged in the state store):
    raised as its task's end so that Celery records the task as failed, and Flower lists it so,
    with the reason, instead of as a success. Tasks name it in `throws`: an expected outcome,
    logged in one line without a traceback, and the message acknowledged (not retried)."""
