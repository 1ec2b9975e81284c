"""Flower's web pages in a real headless Chromium, with two real workers running: the pages a
person opens show the workers, the tasks they ran and every `utxoflow.*` task they registered,
once the browser's JavaScript has rendered them (the workers and tasks tables are filled by
AJAX), and the pages are refused (401) without the credentials of UTXO_FLOWER_BASIC_AUTH.

The browser is Debian's `chromium`, driven over the DevTools protocol on a pipe
(`--remote-debugging-pipe`): no port, no driver, no client library, and the protocol gives what
`--dump-dom` cannot — each document's HTTP status, and a page that can be read again and again
until the AJAX has filled it. `bash .ci/run` installs Chromium; without it this test fails."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chain import Tx
from tests.pipeline.chains import funding, spend
from tests.pipeline.workers import ROOT, Pipeline, pipeline_fixture  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(150)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = (  # as the issue asks: no sandbox (root in CI), nothing that talks to Google
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
)
CREDENTIALS = "ops:s3cret"
WORKERS = ("w1", "w2")
PATIENCE = 60  # seconds for anything to show up on a slow, busy machine (polled, not slept)


class DevToolsError(AssertionError):
    pass


class Chromium:
    """A headless Chromium and one page (tab) in it, driven over the DevTools protocol on a pipe:
    Chromium reads JSON commands, each ended by a NUL byte, on its fd 3, and writes answers and
    events the same way on its fd 4."""

    def __init__(self, profile: Path, log: Path) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # posix_spawn below puts the child's ends at 3 and 4; moved to 5 and up first, so that
        # placing one cannot overwrite the other (subprocess can only place stdin/out/err).
        child_in, child_out = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5) for fd in (cmd_r, out_w))
        os.close(cmd_r)
        os.close(out_w)
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.log = log
        try:
            self.pid = os.posix_spawn(
                CHROMIUM,
                # a profile of its own: nothing shared with (nor locked by) another Chromium
                [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                 "about:blank"],
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                    (os.POSIX_SPAWN_DUP2, child_in, 3),
                    (os.POSIX_SPAWN_DUP2, child_out, 4),
                ],
                setsid=True,  # its own process group: close() can end the renderers and zygotes too
            )
        finally:
            for fd in (child_in, child_out, log_fd):
                os.close(fd)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""
        try:
            # A page of our own (not the startup tab), attached "flat": its commands carry its
            # session id.
            target = self.call("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                     browser=True)["sessionId"]
            self.call("Page.enable")
            self.call("Network.enable")  # the documents' HTTP statuses, and the Authorization header
        except BaseException:
            self.close()  # a browser that came up wrong is not left running
            raise

    # -- protocol ------------------------------------------------------------------------------
    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next message from Chromium, or None at the deadline."""
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._out_r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self._out_r, 1 << 16)
            if not chunk:
                raise DevToolsError(f"Chromium closed the DevTools pipe:\n{self.log_tail()}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        out: dict[str, Any] = json.loads(msg)
        return out

    def call(self, method: str, params: dict[str, Any] | None = None, *, browser: bool = False,
             timeout: float = 30) -> dict[str, Any]:
        """Send a command (to the page, or to the `browser` itself) and return its result,
        keeping the events that arrive meanwhile."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if not browser:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply is None:
                raise DevToolsError(f"no answer to {method} in {timeout} s:\n{self.log_tail()}")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result
            self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Take in events for a while: the pause between two looks at a page (a plain sleep
        would leave Chromium's messages waiting in the pipe)."""
        deadline = time.monotonic() + seconds
        while (msg := self._read(deadline)) is not None:
            self.events.append(msg)

    # -- page ----------------------------------------------------------------------------------
    def authorize(self, credentials: str | None) -> None:
        """Send `user:password` with every request of the page from now on — the document and
        its AJAX calls alike — as a Basic Authorization header (None: no header)."""
        headers = {}
        if credentials is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        self.call("Network.setExtraHTTPHeaders", {"headers": headers})

    def open(self, url: str, timeout: float = 30) -> tuple[int | None, str]:
        """Load `url`: the HTTP status of its document (None: no response, such as a refused
        connection) and Chromium's error for the navigation ("" when none). A page that loads
        is returned once its load event has fired: its scripts have run, the AJAX they start
        may still be under way."""
        self.events.clear()
        nav = self.call("Page.navigate", {"url": url}, timeout=timeout)
        error: str = nav.get("errorText", "")
        deadline = time.monotonic() + timeout
        status = None
        while True:
            for e in self.events:
                p = e.get("params", {})
                if e.get("method") == "Network.responseReceived" and p.get("type") == "Document" \
                        and p.get("loaderId") == nav.get("loaderId"):
                    status = int(p["response"]["status"])
                elif e.get("method") == "Page.loadEventFired" and status is not None:
                    return status, error
            if error and status is None:  # the navigation failed before any response
                return None, error
            assert time.monotonic() < deadline, f"{url} did not load in {timeout} s ({status} {error})"
            self.pump(0.05)

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise DevToolsError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def text(self, selector: str = "body") -> str:
        """The rendered text of the element `selector` (innerText: what a person sees, hidden
        parts left out)."""
        return str(self.evaluate(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''"))

    def rows(self, selector: str) -> list[list[str]]:
        """The rendered text of each cell of each table row that `selector` selects."""
        rows: list[list[str]] = self.evaluate(
            f"Array.from(document.querySelectorAll({json.dumps(selector)}),"
            " tr => Array.from(tr.cells, td => td.innerText.trim()))"
        )
        return rows

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    # -- process -------------------------------------------------------------------------------
    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        """Ask Chromium to quit; if it has not within 10 s, kill its whole process group."""
        try:
            self.call("Browser.close", browser=True, timeout=5)
        except (DevToolsError, OSError):
            pass  # gone or stuck: the kill below
        deadline = time.monotonic() + 10
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:  # the group too when the browser is gone: a renderer or zygote may outlive it
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass  # reaped above
        os.close(self._cmd_w)
        os.close(self._out_r)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(name="browser")
def browser_fixture(tmp_path: Path) -> Iterator[Chromium]:
    if not os.access(CHROMIUM, os.X_OK):
        # Not a skip: CI installs Chromium (.ci/run), so its absence is a broken machine.
        pytest.fail(f"Chromium not found at {CHROMIUM}: install it with `apt-get install -y chromium` "
                    "(bash .ci/run does) to test Flower's pages")
    b = Chromium(tmp_path / "chromium-profile", tmp_path / "chromium.log")
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(name="flower")
def flower_fixture(pipeline: Pipeline) -> Iterator[str]:
    """`utxo flower` with credentials on a free loopback port: its base URL."""
    port = free_port()
    log = open(pipeline.tmp / "flower.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "workers.cli", "flower", "--port", str(port)],
                         env={**pipeline.env, "UTXO_FLOWER_BASIC_AUTH": CREDENTIALS}, cwd=ROOT,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.fixture(name="app_tasks")
def app_tasks_fixture(pipeline: Pipeline) -> Iterator[Callable[[], list[str]]]:
    """Every `utxoflow.*` task a worker registers, as the app has them (so that the test does
    not depend on which tasks exist today): asked in a process of its own — importing the app
    here would fix its configuration for the whole session — started now, read when called
    (its imports take seconds)."""
    code = ("import json; from workers.runtime.app import app; app.loader.import_default_modules(); "
            "print(json.dumps(sorted(n for n in app.tasks if n.startswith('utxoflow.'))))")
    p = subprocess.Popen([sys.executable, "-c", code], env=pipeline.env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def names() -> list[str]:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        found: list[str] = json.loads(out)
        assert {"utxoflow.block.arrived", "utxoflow.tx.arrived"} <= set(found), found
        return found

    try:
        yield names
    finally:
        if p.returncode is None:  # not read: the test failed early
            p.kill()
            p.communicate()


def until_shown(browser: Chromium, url: str, missing: Callable[[], Any], *,
                reload_every: float | None = None, click: str | None = None) -> None:
    """Poll the page at `url` until `missing()` — which reads the page — returns nothing (what
    it returns is what the page lacks, for the failure message). `reload_every` (seconds): load
    the page anew that often, for a table Flower fills once per load (else the page's own
    refreshes are waited for). `click`: an element to click once loaded (a tab)."""
    deadline = time.monotonic() + PATIENCE
    loaded_at: float | None = None
    status: int | None = None
    error, lacks = "", None
    while True:
        if loaded_at is None or (reload_every is not None and time.monotonic() - loaded_at > reload_every):
            status, error = browser.open(url)
            loaded_at = time.monotonic() if status == 200 else None
            if loaded_at is not None and click:
                browser.click(click)
        if loaded_at is not None:
            lacks = missing()
            if not lacks:
                return
        assert time.monotonic() < deadline, (
            f"{url} ({status} {error}) still lacks {lacks!r} after {PATIENCE} s:\n{browser.text()}"
        )
        browser.pump(0.25)  # the AJAX answer, or the page's next refresh


def test_flower_pages_show_the_workers_and_their_tasks_in_a_browser(
    pipeline: Pipeline, browser: Chromium, flower: str, app_tasks: Callable[[], list[str]]
) -> None:
    # (browser before flower: without Chromium the test fails before anything else starts)
    funds = funding(2)
    chain = pipeline.seed(funds)  # spendable outputs at once, for a block's and a mempool tx
    for name in WORKERS:
        pipeline.start_worker(name)
    hosts = [f"{name}@test" for name in WORKERS]

    # Without credentials the page is refused; this also waits for Flower to listen.
    deadline = time.monotonic() + PATIENCE
    while (got := browser.open(flower + "/"))[0] is None:
        assert got[1] == "net::ERR_CONNECTION_REFUSED", got
        assert time.monotonic() < deadline, "Flower did not start:\n" + pipeline.log("flower")
        browser.pump(0.2)
    assert got[0] == 401, got
    assert not any(h in browser.text() for h in hosts)
    browser.authorize("ops:wrong")
    assert browser.open(flower + "/")[0] == 401
    assert browser.open(flower + "/tasks")[0] == 401

    browser.authorize(CREDENTIALS)

    def workers_missing() -> list[str]:
        # "Online" is drawn by the page's script from the AJAX answer (the HTML Flower sends
        # has a bare True), so a worker shown so has been rendered, not just served.
        online = {r[0] for r in browser.rows("#workers-table tbody tr") if len(r) > 1 and r[1] == "Online"}
        return [h for h in hosts if h not in online]

    # Both workers on the dashboard, so Flower's event receiver sees them: the tasks run from
    # now on are seen too.
    until_shown(browser, flower + "/", workers_missing)

    chain.add([spend((funds[0], 0))])
    chain.add()
    mempool: Tx = spend((funds[1], 0))
    # Both at once (each `utxo enqueue` is seconds of imports); the tx spends a seeded output.
    enqueues = [pipeline.enqueue_start("block", chain.blocks), pipeline.enqueue_start("tx", [mempool.raw])]
    for e in enqueues:
        out, err = e.communicate(timeout=120)
        assert e.returncode == 0, out + err
    pipeline.wait()

    # The task history, filled by AJAX once per load: the tasks that ran, by name — searched
    # for by name (the page's own ?name=), as other tasks (recovery scans, block-phase helpers)
    # could push them off the first page.
    for task in ("utxoflow.block.arrived", "utxoflow.txs.arrived"):
        def ran(task: str = task) -> str:
            # A row per task: its name, state and worker among the cells (whatever their order).
            rows = browser.rows("#tasks-table tbody tr")
            return "" if any(task in r and "SUCCESS" in r and set(hosts) & set(r) for r in rows) else task

        until_shown(browser, f"{flower}/tasks?name={urllib.parse.quote(task)}", ran, reload_every=3)

    # Each worker's page lists the tasks it registered (the Limits tab): all of the app's.
    registered = app_tasks()
    for host in hosts:
        until_shown(browser, f"{flower}/worker/{urllib.parse.quote(host)}",
                    lambda: sorted(set(registered) - {r[0] for r in browser.rows("#limits-table tr") if r}),
                    reload_every=3, click="#worker-tab-limits")
