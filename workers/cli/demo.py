"""`utxo demo`: the main job on embedded defaults (CONTRACT.md). It generates a chain, starts
worker processes and Flower, applies the chain through the pipeline, checks the result against
the generator's own model and prints one JSON summary.

Invariants:
- Self-contained: its stores (SQLite UTXO and state stores, file blobs) are in a fresh
  directory, and its broker is a database of its own on the Redis at UTXO_BROKER_URL or a
  private redis-server (workers/demo/localredis.py). No other UTXO_* setting of the caller reaches
  its processes, and the caller's stores and Redis data are never touched.
- Everything it starts (workers, Flower, a private Redis) is stopped when it ends, fails or is
  interrupted by SIGINT or SIGTERM (with --keep: when it is interrupted); each carries
  UTXOFLOW_DEMO_DIR=<its directory> in its environment, so they can be found.
- Blocks go in through the ingest code `utxo enqueue` uses and are waited for as `utxo wait`
  waits; the result is checked against the generator's model (workers/demo/demochain.py), never
  against the store itself.
- stdout holds one JSON object, and only when the check passed; progress goes to stderr. A
  failed check or a pipeline that does not finish is one line on stderr and exit 1.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from chain import hash_to_hex, parse_block
from workers.cli.app import BadInput, Context, cli, emit, log
from workers.cli.progress import Reporter
from workers.demo.demochain import SNAPSHOT_HASH, SNAPSHOT_HEIGHT, DemoChain, block_hash, generate
from workers.demo.localredis import Broker, NoRedis, answers, claim_database, free_port, start_private
from workers.demo.supervisor import Child, Supervisor, interrupts, pause
from workers.settings import mask_url

ROOT = Path(__file__).resolve().parents[2]  # the checkout the workers must import this code from
DEMO_BATCH_SIZE = 1000  # small, so that the 2,500-output transaction spans three records
MARK = "UTXOFLOW_DEMO_DIR"
READY_S = 90.0  # a worker's start on two slow, shared cores


class DemoFailed(Exception):
    """The pipeline did not finish, or its result is not the generator's: one line, exit 1."""


class Demo:
    def __init__(self, obj: Context, data: Path, n_workers: int, timeout: float) -> None:
        self.obj = obj
        self.data = data
        self.n_workers = n_workers
        self.timeout = timeout
        self.batch = int(obj.overrides.get("batch_size", DEMO_BATCH_SIZE))
        self.sup = Supervisor()
        self.broker: Broker | None = None
        self.workers: list[Child] = []
        self.flower_port = 0
        self.urls = {
            "store_url": f"sqlite:///{data}/utxo.db",
            "state_url": f"sqlite:///{data}/state.db",
            "blob_url": f"file://{data}/blobs",
        }

    # -- processes -----------------------------------------------------------------------------
    def start_broker(self) -> None:
        url = self.obj.broker_url()  # one that cannot work at all is refused, not passed over
        if answers(url):
            try:
                self.broker = claim_database(url)
                log(f"broker: {mask_url(self.broker.url)}, a database of its own on the Redis at "
                    f"{mask_url(url)} (the others are left untouched)")
                return
            except NoRedis as e:
                log(f"{e}: starting a private Redis instead")
        else:
            log(f"no Redis answers at {mask_url(url)}: starting a private one")
        mark = {MARK: str(self.data), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.broker, origin = start_private(self.sup, self.data / "redis", mark)
        log(f"broker: {self.broker.url}, a private redis-server (from {origin}), stopped at the end")

    def env(self) -> dict[str, str]:
        """The processes' environment: the caller's without its UTXO_* settings, plus the demo's."""
        assert self.broker is not None
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("UTXO_")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env[MARK] = str(self.data)
        env.update({f"UTXO_{k.upper()}": v for k, v in self.settings().items()})
        return env

    def settings(self) -> dict[str, str]:
        assert self.broker is not None
        return {**self.urls, "broker_url": self.broker.url, "batch_size": str(self.batch)}

    def start_processes(self) -> None:
        env, py = self.env(), sys.executable
        # This process sends the messages (workers.runtime.app reads the broker from the environment)
        # and reads the stores: the same settings as its children, and no others.
        for k in [k for k in os.environ if k.upper().startswith("UTXO_")]:
            del os.environ[k]
        os.environ.update({k: v for k, v in env.items() if k.startswith("UTXO_")})
        self.flower_port = free_port()
        self.sup.start("flower", [py, "-m", "workers.cli", "flower", "--port", str(self.flower_port),
                                  "--address", "127.0.0.1"], env=env, cwd=self.data,
                       log=self.data / "flower.log")
        host = socket.gethostname()
        for i in range(1, self.n_workers + 1):
            self.workers.append(self.sup.start(
                f"worker-{i}", [py, "-m", "workers.cli", "worker", "-n", f"demo{i}@{host}", "-c", "1"],
                env=env, cwd=self.data, log=self.data / f"worker-{i}.log",
            ))

    def wait_ready(self, rep: Reporter) -> None:
        deadline = time.monotonic() + READY_S
        waiting = list(self.workers)
        with rep.step("start workers", len(waiting), "workers") as advance:
            while waiting:
                for w in list(waiting):
                    assert w.log is not None
                    if w.log.is_file() and b" ready." in w.log.read_bytes():
                        waiting.remove(w)
                        advance(1)
                    elif not w.alive():
                        raise DemoFailed(f"{w.name} exited while starting: {w.tail()} (log: {w.log})")
                if waiting and time.monotonic() > deadline:
                    w = waiting[0]
                    raise DemoFailed(f"{w.name} not ready after {READY_S:.0f} s (log: {w.log})")
                pause(0.1)

    def flower_address(self) -> str | None:
        """Flower's address once it listens (it starts alongside the workers; a few seconds)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.flower_port), timeout=1):
                    return f"http://127.0.0.1:{self.flower_port}"
            except OSError:
                pause(0.2)
        log(f"warning: Flower is not listening on port {self.flower_port} (see {self.data / 'flower.log'})")
        return None

    def stop(self) -> None:
        """Workers and Flower first (they use the Redis), then the private Redis, then the claim."""
        t0, n = time.perf_counter(), len(self.sup.children)
        self.sup.stop([c for c in self.sup.children if c.name != "redis"], timeout=10)
        self.sup.stop(timeout=5)
        if self.broker is not None:
            self.broker.release()
        if n:
            log(f"stopped the {n} processes it started in {time.perf_counter() - t0:.1f} s")

    # -- the chain -----------------------------------------------------------------------------
    def seed(self, chain: DemoChain) -> None:
        from stores.utxo import open_utxo_store

        s = self.obj.settings
        store = open_utxo_store(self.urls["store_url"], **(s.store_options() | {
            "batch_size": self.batch, "blob_url": self.urls["blob_url"]}))
        try:
            store.import_utxos(chain.snapshot, height=SNAPSHOT_HEIGHT, block_hash=SNAPSHOT_HASH)
        finally:
            store.close()

    def apply(self, rep: Reporter, label: str, blocks: list[bytes], deadline: float) -> float:
        """Enqueue `blocks` as `utxo enqueue` does, and wait as `utxo wait` does until each is
        settled; the seconds it took. Progress counts the transactions of settled blocks."""
        from workers.runtime.ingest import submit_block
        from workers.runtime.registry import BlockSettled
        from workers.runtime.services import services

        svc = services(**self.settings())
        settled = BlockSettled(svc.state)
        start = time.perf_counter()
        parsed = [parse_block(raw) for raw in blocks]
        sizes: dict[str, int] = {}  # the blocks enqueued and not settled yet → their tx counts
        polled = settle_checked = time.monotonic()
        with rep.step(label, sum(len(b.txs) for b in parsed), "txs") as advance:

            def poll() -> None:
                nonlocal polled, settle_checked
                pending = svc.registry.pending()
                done = [i for i in sizes if i not in pending]
                if time.monotonic() - settle_checked > 1.0:  # now and then, not at every poll:
                    # a block whose message's worker died is done once the chain settles it
                    done += settled([i for i in sizes if i in pending])
                    settle_checked = time.monotonic()
                for ident in done:
                    svc.registry.done(ident)
                    advance(sizes.pop(ident))
                polled = time.monotonic()

            for raw, b in zip(blocks, parsed):
                sizes[f"block:{submit_block(raw, svc, b, index=True)}"] = len(b.txs)
                pause(0)  # (a stop signal noted: acted on between blocks)
                if time.monotonic() - polled > 0.5:  # the workers are at it already: show it
                    poll()
            while sizes:
                poll()
                if not sizes:
                    break
                if not any(w.alive() for w in self.workers):
                    w = self.workers[0]
                    raise DemoFailed(f"every worker has exited: {w.tail()} (log: {w.log})")
                if time.monotonic() > deadline:
                    raise DemoFailed(f"{label}: {len(sizes)} of {len(blocks)} blocks not applied after "
                                     f"--timeout {self.timeout:.0f} s (worker logs in {self.data})")
                pause(0.1)
        return time.perf_counter() - start

    def run(self, blocks: int, txs_per_block: int, keep: bool) -> dict[str, Any]:
        started = time.perf_counter()
        log(f"demo data in {self.data}, a fresh directory kept afterwards: SQLite UTXO and state "
            f"stores (utxo.db, state.db), file blobs (blobs/); {self.batch} outputs per record")
        self.start_broker()
        self.start_processes()
        log(f"Flower: http://127.0.0.1:{self.flower_port} ({self.n_workers} workers; logs in {self.data})")
        with Reporter() as rep:
            with rep.step("generate chain", None, "blocks") as advance:
                try:
                    chain = generate(blocks, txs_per_block, self.batch)
                except ValueError as e:
                    raise BadInput(str(e)) from None
                advance(chain.n_blocks)
            self.seed(chain)
            self.wait_ready(rep)
            deadline = time.monotonic() + self.timeout
            seconds = self.apply(rep, "apply first branch", chain.main, deadline)
            self.expect_tip(block_hash(chain.main[-1]), "the first branch")
            seconds += self.apply(rep, "apply heavier branch", chain.side, deadline)
            self.expect_tip(chain.tip_hash, "the heavier branch")
        summary = self.check(chain)
        pause(0)  # (a stop signal noted while checking: no summary of a run the user stopped)
        return {
            "blocks": chain.n_blocks,
            "txs": chain.n_txs,
            "tx_per_s": round(chain.n_txs / seconds, 1),
            **summary,
            "workers": self.n_workers,
            "flower": self.flower_address(),
            "broker": mask_url(self.broker.url) if self.broker else None,
            "private_redis": bool(self.broker and self.broker.private),
            "dir": str(self.data),
            **self.urls,
            "batch_size": self.batch,
            "seconds": round(time.perf_counter() - started, 1),
            "kept_running": keep,
        }

    def expect_tip(self, want: bytes, what: str) -> None:
        from workers.runtime.services import services

        state = services().state
        tip = state.tip()
        if tip is None or tip.hash != want:
            e = state.get_block(want)
            status = f"{e.status.value}{': ' + e.reason if e and e.reason else ''}" if e else "unknown"
            raise DemoFailed(f"the tip is not {what}'s last block {hash_to_hex(want)} ({status}) but "
                             f"{hash_to_hex(tip.hash) if tip else 'none'}")

    def check(self, chain: DemoChain) -> dict[str, Any]:
        """The store's confirmed view against the generator's model; the summary's figures."""
        from stores.state import BlockStatus
        from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)
        from workers.runtime.services import services

        svc = services()
        got = {(u.txid, u.vout): u.satoshis for u in svc.utxo.iter_utxos(confirmed=True)}
        stats = svc.utxo.stats()
        want = chain.expected
        figures = (len(got), sum(got.values()), stats.utxos, stats.satoshis)
        if got != want or figures[2:] != figures[:2]:
            odd = next(iter((set(want) - set(got)) or (set(got) - set(want))), None)
            example = f"; e.g. {hash_to_hex(odd[0])}:{odd[1]}" if odd else ""
            raise DemoFailed(
                f"check failed: the store's confirmed set is {stats.utxos} UTXOs, {stats.satoshis} satoshis "
                f"({len(got)} listed), the chain's {len(want)}, {sum(want.values())}{example}")
        big = svc.utxo.get(chain.big.txid)
        if big.total_extra_recs != chain.records - 1 or big.creating:
            raise DemoFailed(f"check failed: tx {chain.big.txid_hex} spans {big.total_extra_recs + 1} "
                             f"records, expected {chain.records}")
        if not svc.utxo.get(chain.double_spent.txid).conflicting:
            raise DemoFailed(f"check failed: the double-spent tx {chain.double_spent.txid_hex} is not "
                             "conflicting")
        remined = svc.utxo.get(chain.remined.txid)
        if remined.conflicting or chain.fork_height + 1 not in remined.block_heights:
            raise DemoFailed(f"check failed: tx {chain.remined.txid_hex} is not mined on the heavier branch")
        entries = [svc.state.get_block(block_hash(raw)) for raw in chain.main]
        disconnected = sum(1 for e in entries if e is not None and e.status is BlockStatus.SIDE)
        tip = svc.state.tip()  # the generator's tip: expect_tip has seen to it
        assert tip is not None
        # the commitment the workers kept block by block, through the reorg, against the set's
        kept = svc.state.get_commitment(tip.hash)
        again = commitment.of_utxos(svc.utxo.iter_utxos(confirmed=True))
        if kept != again:
            shown = commitment.muhash_hex(kept) if kept else "missing"
            raise DemoFailed(f"check failed: the tip's commitment is {shown}, the confirmed set's "
                             f"{commitment.muhash_hex(again)}")
        return {
            "utxos": stats.utxos,
            "satoshis": stats.satoshis,
            "tip": {"height": tip.height, "hash": hash_to_hex(tip.hash)},
            "muhash": commitment.muhash_hex(again),
            "reorgs": 1 if disconnected else 0,  # the first branch's tip was applied, then taken away
            "reorg": {
                "fork_height": chain.fork_height, "disconnected": disconnected, "connected": len(chain.side),
                "remined_txid": chain.remined.txid_hex, "double_spent_txid": chain.double_spent.txid_hex,
                "replacement_txid": chain.replacement.txid_hex,
            },
            "multi_record_tx": chain.big.txid_hex,
            "multi_record_outputs": len(chain.big.outputs),
            "multi_record_records": chain.records,
        }


def _fresh_dir(given: Path | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="utxo-demo-")).resolve()
    if given.exists() and (not given.is_dir() or any(given.iterdir())):
        raise BadInput(f"--dir {given}: not an empty directory (the demo needs fresh stores)")
    given.mkdir(parents=True, exist_ok=True)
    return given.resolve()


@cli.command("demo")
@click.option("--blocks", type=click.IntRange(min=3), default=20, show_default=True,
              help="Blocks of the first branch (the heavier branch adds 3 from 2 below its tip).")
@click.option("--txs-per-block", type=click.IntRange(min=4), default=400, show_default=True,
              help="Transactions per block besides the coinbase.")
@click.option("--workers", "n_workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker processes to start.")
@click.option("--dir", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the stores go: an empty or new directory (default: a fresh temporary one).")
@click.option("--keep", is_flag=True, help="Leave the workers, Flower and Redis running until Ctrl-C.")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds the pipeline may take to apply the chain.")
@click.pass_obj
def demo_cmd(obj: Context, blocks: int, txs_per_block: int, n_workers: int, data_dir: Path | None,
             keep: bool, timeout: float) -> int:
    """Generate a chain, apply it with worker processes, check it and print a summary.

    Runs on embedded defaults with nothing else running: SQLite stores and file blobs in a
    fresh directory, and a private Redis unless one answers at UTXO_BROKER_URL (then a free
    database of it). The chain spends mature coinbases of a seeded snapshot, has parents and
    children in one block, a transaction spanning several records, and a heavier branch that
    takes the tip (a reorg: one transaction mined again, one double-spent). Flower shows the
    workers meanwhile. Exit 0 when the store's confirmed UTXO set is the chain's, 1 when not.
    """
    ignored = [k for k in ("store_url", "state_url", "blob_url") if k in obj.overrides]
    if ignored:
        log(f"warning: the demo uses stores of its own; --{ignored[0].replace('_', '-')} is ignored")
    data = _fresh_dir(data_dir)
    demo = Demo(obj, data, n_workers, timeout)
    summary: dict[str, Any] | None = None
    failed: str | None = None
    code = 0
    with interrupts():
        try:
            summary = demo.run(blocks, txs_per_block, keep)
            if keep:
                emit(summary)
                log(f"--keep: the workers, Flower ({summary['flower']}) and the broker keep running; "
                    "Ctrl-C stops them. Query with: " + " ".join(
                        f"UTXO_{k.upper()}={v}" for k, v in demo.settings().items()) + " utxo tip")
                while True:
                    pause(1)
        except KeyboardInterrupt as e:
            why = str(e) or "SIGINT"  # (the handler names it; a Ctrl-C before it is in place does not)
            if summary is None or not keep:
                failed, code = f"interrupted ({why})", 130
            log(f"{why}: stopping what it started")
        except NoRedis as e:
            raise BadInput(str(e)) from None
        except DemoFailed as e:
            failed, code = " ".join(str(e).split()), 1
        finally:
            demo.stop()
    if failed is not None:
        sys.stderr.write(f"utxo: error: {failed}\n")
    elif summary is not None and not keep:
        emit(summary)
    return code
