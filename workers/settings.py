"""Settings: every variable of the README's settings table and of the designs followed (Teranode's
pruner and lock records, the transaction-recovery service's design),
read from the environment under the `UTXO_` prefix (a `.env` file in the working directory is
honoured; the real environment wins over it, explicit overrides win over both).

Names are the field names upper-cased with the prefix: `store_url` ↔ `UTXO_STORE_URL`.
Durations are seconds (an integer or decimal; `500ms`, `30s`, `10m`, `1h` are accepted too, as
those designs write them). `unmined_tx_retention` defaults to half of `block_height_retention`.

`load_settings(**overrides)` is the entry point; a bad value raises SettingsError (a ValueError)
whose message names the variable, e.g. `UTXO_BATCH_SIZE: must be greater than 0 (got '0')`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BeforeValidator, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from stores.utxo.factory import default_batch_size

ENV_PREFIX = "UTXO_"
ENV_FILE = ".env"
# The broker's queues (celeryconfig.py routes the tasks to them; `utxo status` counts them)
QUEUES = ("blocks", "txs", "prune", "recovery")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class SettingsError(ValueError):
    """A setting with a bad value; the message names the variable."""


def _duration(value: Any) -> Any:
    """`30`, `30.5`, `500ms`, `30s`, `10m`, `1h` → seconds (float); other types pass through."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ValueError("must be a duration in seconds, e.g. 30, 30s, 10m, 1h")
        return float(m.group(1)) * _UNIT[m.group(2)]
    return value


Seconds = Annotated[float, BeforeValidator(_duration), Field(ge=0)]
PositiveSeconds = Annotated[float, BeforeValidator(_duration), Field(gt=0)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=ENV_FILE,
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
    )

    # -- CONTRACT.md ---------------------------------------------------------------------------
    store_url: str = "sqlite:///./data/utxo.db"
    blob_url: str = "file://./data/blobs"
    state_url: str = "sqlite:///./data/state.db"
    broker_url: str = "redis://127.0.0.1:6379/0"
    batch_size: PositiveInt = 20000
    max_tx_size_in_store: PositiveInt = 1048576
    externalize_all: bool = False
    external_cache_mb: NonNegativeInt = 64  # bounded cache of external transactions read back
    block_height_retention: NonNegativeInt = 288  # 0: records are never pruned
    allow_missing_inputs: bool = False

    # a starting worker waits this long for a store it cannot reach yet, consuming nothing, then
    # refuses to start (exit 2); a store URL that cannot work at all is refused at once
    store_wait: Seconds = 60.0

    # -- applying blocks -------------------------------------------------------------------------
    block_chunk_txs: PositiveInt = 1000  # transactions per unit of a block phase (shared by workers)
    # helper tasks sent per phase at most (0: none); unset: `chunk_helpers()` decides by store
    block_chunk_helpers: NonNegativeInt | None = None
    # a block task applies the chain this long (then one block more at most), then hands on:
    # how soon a worker told to stop stops, however long the chain ahead
    block_task_budget: PositiveSeconds = 5.0

    # -- Flower ------------------------------------------------------------------------------------
    flower_address: str = "127.0.0.1"
    flower_basic_auth: str = ""  # "user:password[,user2:password2]"; required off loopback

    # -- operations (workers/ops/) ---------------------------------------------------------------
    metrics_port: NonNegativeInt = 0  # a worker serves Prometheus metrics on it (0: it does not)
    metrics_address: str = "0.0.0.0"  # …on this address (a scrape comes from another host)
    log_json: bool = False  # log lines are JSON objects (one per line), for shipping as they are

    # -- pruner (Teranode's pruner service) --------------------------------------------------------
    pruner_job_timeout: PositiveSeconds = 600.0
    pruner_chunk_size: PositiveInt = 1000
    pruner_chunk_group_limit: PositiveInt = 10
    pruner_progress_log_interval: Seconds = 30.0  # 0 disables progress logging
    pruner_defensive_enabled: bool = False
    pruner_defensive_batch_read_size: PositiveInt = 10000
    unmined_tx_retention: NonNegativeInt | None = None  # None: block_height_retention // 2
    parent_preservation_blocks: PositiveInt = 14400
    disable_dah_cleaner: bool = False

    # -- recovery (the transaction-recovery service's design; workers/recovery/) -------------------
    recovery_enabled: bool = True  # workers of the `recovery` queue contend to run the manager
    recovery_ttl: Seconds = 30.0
    recovery_scan_interval: PositiveSeconds = 5.0
    recovery_batch_size: PositiveInt = 100
    recovery_workers: PositiveInt = 4
    recovery_lease: PositiveSeconds = 30.0
    recovery_not_found_grace: Seconds = 1800.0  # 0 disables the NotFound → orphan promotion
    # the PostgreSQL advisory lock the leader holds (the seed's own id); on SQLite, a lease row
    recovery_advisory_lock_id: int = 8389190333894887286
    recovery_instance_id: str = ""  # the manager's name ("": host:pid:token)

    # -- re-sending messages a broker lost (workers/recovery/requeue.py, `utxo beat`) -----------------------
    requeue_after: PositiveSeconds = 300.0  # a message pending this long is sent again (longer than a block)
    requeue_interval: PositiveSeconds = 10.0  # how often workers (and `utxo beat`) send the re-sending scan

    # -- lock records of two-phase creation (Teranode's lock-record pattern), seconds --------------
    lock_base_ttl: PositiveInt = 30
    lock_per_record_ttl: NonNegativeInt = 2
    lock_max_ttl: PositiveInt = 300

    @model_validator(mode="after")
    def _derived(self) -> Settings:
        if self.unmined_tx_retention is None:
            self.unmined_tx_retention = self.block_height_retention // 2
        own = default_batch_size(self.store_url) if "batch_size" not in self.model_fields_set else None
        if own is not None:  # the backend's own default (an Aerospike record: stores.utxo.factory)
            self.batch_size = own
        if self.lock_max_ttl < self.lock_base_ttl:
            raise ValueError(
                f"{ENV_PREFIX}LOCK_MAX_TTL ({self.lock_max_ttl}) must not be below "
                f"{ENV_PREFIX}LOCK_BASE_TTL ({self.lock_base_ttl})"
            )
        return self

    def store_options(self) -> dict[str, Any]:
        """Keyword arguments of `open_utxo_store` from these settings (URL aside)."""
        return {
            "retention": self.block_height_retention,
            "batch_size": self.batch_size,
            "lock_base_ttl": self.lock_base_ttl,
            "lock_per_record_ttl": self.lock_per_record_ttl,
            "lock_max_ttl": self.lock_max_ttl,
            "blob_url": self.blob_url,
            "max_tx_size_in_store": self.max_tx_size_in_store,
            "externalize_all": self.externalize_all,
            "external_cache_bytes": self.external_cache_mb << 20,
        }

    def chunk_helpers(self) -> int:
        """UTXO_BLOCK_CHUNK_HELPERS, or by default 4 — but 0 on a SQLite UTXO store, which takes
        one writer at a time: `python -m bench.pipeline` measured sharing a block's phases
        there about 15% slower than one worker running them (PostgreSQL gains)."""
        if self.block_chunk_helpers is not None:
            return self.block_chunk_helpers
        return 0 if self.store_url.startswith("sqlite:") else 4

    def lock_ttl(self, records: int) -> int:
        """Seconds a lock record lives for a transaction of `records` records."""
        return min(self.lock_base_ttl + self.lock_per_record_ttl * records, self.lock_max_ttl)

    def public(self) -> dict[str, Any]:
        """The effective values with passwords in URLs masked: what `utxo config` prints."""
        out = self.model_dump()
        for k, v in out.items():
            if k.endswith("_url") and isinstance(v, str):
                out[k] = mask_url(v)
        if out.get("flower_basic_auth"):
            out["flower_basic_auth"] = ",".join(
                f"{pair.split(':', 1)[0]}:***" for pair in str(out["flower_basic_auth"]).split(",")
            )
        return out


_SECRET_PARAMS = re.compile(r"pass|secret|token|key", re.IGNORECASE)


def mask_url(url: str) -> str:
    """`scheme://user:secret@host/...` → `scheme://user:***@host/...`; secret-looking query values too."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAMS.search(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _SECRET_PARAMS.search(k) else v) for k, v in pairs], safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # untouched (urlunsplit would also drop the empty authority of sqlite:///)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _explain(err: ValidationError) -> str:
    msgs = []
    for e in err.errors():
        loc = e.get("loc") or ()
        field = str(loc[0]) if loc else ""
        text = str(e.get("msg", "invalid value"))
        text = text.removeprefix("Value error, ")
        if field:
            got = e.get("input")
            name = env_name(field)
            msgs.append(f"{name}: {text.lower() if text[:1].isupper() else text} (got {got!r})")
        else:
            msgs.append(text)
    return "; ".join(msgs)


def load_settings(**overrides: Any) -> Settings:
    """The effective settings: overrides (None values ignored) over environment over `.env`."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(Settings.model_fields)
    if unknown:
        raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
    try:
        return Settings(**given)
    except ValidationError as e:
        raise SettingsError(_explain(e)) from None


def unknown_variables(env_file: str | Path = ENV_FILE) -> list[str]:
    """`UTXO_*` names set in the environment or `.env` that are no setting (likely typos)."""
    known = {env_name(f) for f in Settings.model_fields}
    names = {k.upper() for k in os.environ if k.upper().startswith(ENV_PREFIX)}
    path = Path(env_file)
    if path.is_file():
        try:
            from dotenv import dotenv_values

            names |= {k.upper() for k in dotenv_values(path) if k.upper().startswith(ENV_PREFIX)}
        except (ImportError, OSError, UnicodeDecodeError):
            pass
    return sorted(names - known)
