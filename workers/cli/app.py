"""The `utxo` group: global options, output helpers, and the one place errors become exit codes.

Exit codes (CONTRACT.md): 0 ok; 1 not found; 2 bad input or bad usage, with exactly one line on
stderr (`utxo: error: …`) naming what is wrong. An unexpected exception (a bug) is one line too,
`utxo: internal error: …`, exit 3; `utxo --debug …` shows its traceback instead. 4: `utxo wait`
finished, and some of what it waited for was refused (listed on stdout, counted on stderr).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

import click

from chain import ParseError
from stores.errors import StoreError
from stores.state import StateStore, open_state_store
from stores.utxo import UtxoStore, open_utxo_store
from workers.settings import Settings, SettingsError, load_settings, unknown_variables

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_REFUSED = 4  # `utxo wait`: everything finished, some of it refused


class NotFound(Exception):
    """Something asked for does not exist: one line on stderr, exit 1."""


class BadInput(ValueError):
    """Bad input or usage detected by a command: one line on stderr, exit 2."""


class OutputClosed(Exception):
    """The reader of stdout went away (`utxo utxos | head`): stop quietly, exit 0.

    Not an OSError on purpose: click turns a broken pipe it sees into exit 1 ("not found")."""


@dataclass
class Context:
    overrides: dict[str, Any] = field(default_factory=dict)
    _settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(**self.overrides)
            for name in unknown_variables():
                log(f"warning: {name} is not a setting (ignored)")
        return self._settings

    def broker_url(self, then: str = "") -> str:
        """UTXO_BROKER_URL, refused (BadInput naming it, then `then`) when it cannot work at all
        (workers.broker.runs.broker_error: a URL no broker takes, or a Redis that refuses its database
        or credentials): checked before anything is started, opened or sent."""
        from workers.broker.runs import broker_error

        url = self.settings.broker_url
        error = broker_error(url)
        if error is not None:
            raise BadInput(error + then)
        return url

    def open_store(self, url: str | None = None, *, create: bool = True) -> UtxoStore:
        """The UTXO store of the settings; readers pass create=False, so that a mistyped URL is
        an error rather than a new, empty store."""
        s = self.settings
        return open_utxo_store(url or s.store_url, create=create, **s.store_options())

    def open_state(self, *, create: bool = True) -> StateStore:
        """The state store of the settings (create=False for readers, as `open_store`)."""
        return open_state_store(self.settings.state_url, create=create)


def log(message: str) -> None:
    """One line of progress or logging on stderr."""
    sys.stderr.write(f"utxo: {message}\n")
    sys.stderr.flush()


def emit(obj: Any) -> None:
    """One JSON value on one line of stdout."""
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed() from None


@click.group(
    name="utxo",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option("--store-url", metavar="URL", help="UTXO store (UTXO_STORE_URL).")
@click.option("--blob-url", metavar="URL", help="Blob store (UTXO_BLOB_URL).")
@click.option("--state-url", metavar="URL", help="State store (UTXO_STATE_URL).")
@click.option("--broker-url", metavar="URL", help="Celery broker (UTXO_BROKER_URL).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Outputs per record (UTXO_BATCH_SIZE).")
@click.option(
    "--max-tx-size-in-store", type=click.IntRange(min=1),
    help="Larger transactions go to the blob store (UTXO_MAX_TX_SIZE_IN_STORE).",
)
@click.option(
    "--externalize-all/--no-externalize-all", default=None,
    help="Store every transaction externally (UTXO_EXTERNALIZE_ALL).",
)
@click.option(
    "--retention", "block_height_retention", type=click.IntRange(min=0),
    help="Blocks a fully spent record is kept; 0: never pruned (UTXO_BLOCK_HEIGHT_RETENTION).",
)
@click.option(
    "--allow-missing-inputs/--no-allow-missing-inputs", default=None,
    help="Skip inputs whose parent is unknown (UTXO_ALLOW_MISSING_INPUTS).",
)
@click.option("--debug", is_flag=True, help="Show a traceback for unexpected errors.")
@click.version_option(package_name="utxoflow", prog_name="utxo")
@click.pass_context
def cli(ctx: click.Context, /, debug: bool, **overrides: Any) -> None:
    """utxoflow: a horizontally scalable BSV UTXO store.

    Output is JSON on stdout; progress and logs go to stderr. Settings come from UTXO_*
    environment variables (a .env file in the working directory is honoured); the options
    above override them. Exit codes: 0 ok, 1 not found (or a wait that timed out), 2 bad input or
    usage (one line on stderr naming what is wrong), 3 internal error (a bug: --debug shows it),
    4 `utxo wait` finished and some of what it waited for was refused.
    """
    ctx.obj = Context(overrides={k: v for k, v in overrides.items() if v is not None})


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(kind: str, message: str, code: int) -> NoReturn:
    sys.stderr.write(f"utxo: {kind}: {_one_line(message)}\n")
    sys.exit(code)


class StoreWarnings(logging.Handler):
    """The stores' warnings (logger `utxoflow.store`: a store created with another
    UTXO_BATCH_SIZE, say) as one `utxo: warning: …` line each on stderr — while nothing else has
    set up logging: a worker's log is Celery's, and they go there."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            log(f"warning: {_one_line(record.getMessage())}")


def _store_warnings() -> None:
    store_log = logging.getLogger("utxoflow.store")
    if not any(isinstance(h, StoreWarnings) for h in store_log.handlers):
        store_log.addHandler(StoreWarnings())


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `utxo` console script."""
    args = sys.argv[1:] if argv is None else argv
    _store_warnings()
    debug = "--debug" in args[: args.index("--")] if "--" in args else "--debug" in args
    try:
        rv = cli.main(args=args, prog_name="utxo", standalone_mode=False)
        code = rv if isinstance(rv, int) else EXIT_OK
    except click.exceptions.NoArgsIsHelpError:
        # One line, as for every usage error (the help is one `utxo --help` away).
        sys.stderr.write("utxo: error: a command is missing (utxo --help lists them)\n")
        code = EXIT_BAD_INPUT
    except click.ClickException as e:
        _fail("error", e.format_message(), EXIT_BAD_INPUT)
    except click.Abort:
        _fail("error", "aborted", 130)
    except KeyboardInterrupt:
        _fail("error", "interrupted", 130)
    except NotFound as e:
        _fail("not found", str(e), EXIT_NOT_FOUND)
    except (OutputClosed, BrokenPipeError):
        _silence_stdout()
        code = EXIT_OK
    except (SettingsError, ParseError, StoreError, BadInput, ValueError, OSError) as e:
        if debug:
            raise
        message = str(e) or type(e).__name__
        if isinstance(e, StoreError):
            message = f"[{e.code}] {message}"
        elif isinstance(e, OSError) and e.filename is not None:
            message = f"{e.strerror or e}: {e.filename}"
        _fail("error", message, EXIT_BAD_INPUT)
    except Exception as e:
        if debug:
            raise
        message = f"{type(e).__name__}: {e} (rerun with --debug for a traceback)"
        _fail("internal error", message, EXIT_INTERNAL)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    sys.exit(code)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
