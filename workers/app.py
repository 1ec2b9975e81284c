"""`celery -A workers.app`, the name the contract gives the app (`celery -A workers.app worker`
runs a worker as `utxo worker` does): the app of `workers.runtime.app`, where it is made."""

from workers.runtime.app import app

__all__ = ["app"]
