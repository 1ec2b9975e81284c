"""One connection to an Aerospike cluster for the UTXO store: the URL, the client, and the Lua
module (`utxoflow.lua`) registered under a name of its own content's hash.

    aerospike://HOST:PORT[,HOST:PORT…]/NAMESPACE?set=SET[&user=U&password=P&timeout_ms=N]

Invariants:
- The module's registered name carries its content's hash (`utxoflow_<12 hex>`), so two
  versions of utxoflow sharing a cluster during a rolling upgrade each call their own rules;
  registering is skipped when the cluster has that name already.
- The client's Lua user path is a private directory of this process (the client writes a copy
  of each module it registers there), never the working directory.
- Every failure of the client surfaces as `StorageError` naming the URL without its password;
  a URL that cannot work is a `ValueError` naming the part that is wrong.
- A namespace the store cannot use is refused when the connection opens, by name: one that
  some node does not have; one (or a set) that gives records an expiry by default (`default-ttl`
  not 0: every write without a TTL of its own, Lua updates too, would set the record to expire,
  and UTXOs would vanish); one that forbids records with an expiry (`nsup-period 0` without
  `allow-ttl-without-nsup`: Aerospike's default), since the lock records of two-phase creation
  expire (otherwise the first multi-record transaction fails with a bare result code). It is
  a `ValueError`, as a URL that cannot work: a worker refuses to start rather than wait for it.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from stores.errors import StorageError
from stores.sqldb import mask_url

log = logging.getLogger("utxoflow.store")
LUA_SOURCE = Path(__file__).with_name("utxoflow.lua")
Key = tuple[str, str, bytearray]  # (namespace, set, user key): see `Connection.key`
BATCH = 5000  # records per batch call: a bounded fan-out, whatever the caller hands in
NOT_RUN = frozenset({14, 18})  # KEY_BUSY, DEVICE_OVERLOAD: the server did not run the request
RETRIES, BACKOFF = 8, 0.005  # seconds, doubling: 1.3 s in all


# A batch of distinct records runs faster spread over the server's service threads than
# inline in the thread that took it (`allow_inline` off: on 2 cores, bench.store's phases
# +20-40 %, its plain-write limit +25 %). Calls on one record cannot run side by side,
# though: they wait for it, and past the namespace's `transaction-pending-limit` (20 by
# default) the server answers KEY_BUSY. 1,000 spends of one parent spread came back busy 770
# times and took 1.5x as long as inline, so a batch with a record more often than this runs inline.
# (The client has one flag for in-memory namespaces and one for those on devices, whose default
# is spread whatever the batch holds: both are set alike.)
SPREAD_REPEATS = 8


def spread(keys: Sequence[Key]) -> bool:
    """Whether a batch on these keys may go to the service threads: no record comes up in it
    more than SPREAD_REPEATS times."""
    seen: dict[bytes, int] = {}
    for key in keys:
        k = bytes(key[2])
        n = seen[k] = seen.get(k, 0) + 1
        if n > SPREAD_REPEATS:
            return False
    return True


def placed(policy: dict[str, Any], inline: bool | None, keys: Sequence[Key]) -> dict[str, Any]:
    """`policy` with where the server runs a batch on these keys: inline as `inline` says, or,
    for None, spread unless a record repeats (`spread`); the in-memory and device flags alike."""
    if inline is None:
        inline = not spread(keys)
    return {**policy, "allow_inline": inline, "allow_inline_ssd": inline}


def chunked(items: Sequence[Any], n: int = BATCH) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


DEFAULT_SET = "txs"


@dataclass(frozen=True)
class AerospikeUrl:
    hosts: tuple[tuple[str, int], ...]
    namespace: str
    set: str = DEFAULT_SET
    user: str | None = None
    password: str | None = None
    timeout_ms: int = 5000
    extra: dict[str, str] = field(default_factory=dict)  # the store's own options (batch_size …)


def parse_url(url: str) -> AerospikeUrl:
    """The parts of an `aerospike://` URL; ValueError naming what is wrong."""
    if not url.lower().startswith("aerospike://"):
        raise ValueError(f"not an aerospike:// URL: {mask_url(url)}")
    rest = url[len("aerospike://") :]
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    if not netloc:
        raise ValueError(f"aerospike URL {mask_url(url)} names no host (aerospike://HOST:PORT/NAMESPACE)")
    namespace = path.strip("/")
    if not namespace or "/" in namespace:
        raise ValueError(
            f"aerospike URL {mask_url(url)} must name one namespace: aerospike://HOST:PORT/NAMESPACE"
        )
    hosts = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = part.strip(), "3000"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"aerospike URL {mask_url(url)}: bad host {part!r} (HOST:PORT)")
        hosts.append((host.strip("[]"), int(port)))
    params = dict(parse_qsl(query, keep_blank_values=True))
    set_name = params.pop("set", DEFAULT_SET)
    if not set_name or len(set_name) > 63:
        raise ValueError(f"aerospike URL {mask_url(url)}: set must be 1 to 63 characters")
    timeout = params.pop("timeout_ms", "5000")
    if not timeout.isdigit() or int(timeout) <= 0:
        raise ValueError(f"aerospike URL {mask_url(url)}: timeout_ms must be a positive integer")
    return AerospikeUrl(
        tuple(hosts), namespace, set_name, params.pop("user", None), params.pop("password", None),
        int(timeout), params,
    )  # fmt: skip


def _conf(text: str, sep: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.strip().rstrip(";").split(sep) if "=" in kv)


def namespace_problem(
    namespace: str, set_name: str, answers: dict[str, str], set_answers: dict[str, str]
) -> str | None:
    """Why the store cannot keep its records in `namespace` and `set_name`, from each node's
    answer to the info commands `namespace/NS` (`key=value;…`) and `sets/NS/SET` (`key=value:…`;
    empty for a set the node has not seen); None when it can."""
    for node, text in sorted(answers.items()):
        conf = _conf(text, ";")
        if conf.get("type") == "unknown" or "nsup-period" not in conf:
            return f"node {node} has no namespace {namespace!r}"
        if conf.get("default-ttl", "0") != "0":
            return (
                f"namespace {namespace!r} gives records an expiry by default on node {node} "
                f"(default-ttl {conf['default-ttl']}), and the store's records must never expire: "
                "set default-ttl 0"
            )
        if conf["nsup-period"] == "0" and conf.get("allow-ttl-without-nsup") != "true":
            return (
                f"namespace {namespace!r} forbids records with an expiry on node {node} (nsup-period 0), "
                "and the lock records of two-phase creation expire: set nsup-period "
                "(deploy/aerospike/aerospike.conf sets 10)"
            )
    for node, text in sorted(set_answers.items()):
        ttl = _conf(text, ":").get("default-ttl", "0")
        if ttl != "0":
            return (
                f"set {set_name!r} gives records an expiry by default on node {node} (default-ttl {ttl}), "
                "and the store's records must never expire: set its default-ttl to 0"
            )
    return None


def module_name(source: str) -> str:
    return "utxoflow_" + hashlib.sha256(source.encode()).hexdigest()[:12]


class Connection:
    """A connected client and the name of this code's Lua module on the cluster."""

    def __init__(self, url: str) -> None:
        import aerospike  # the client is needed only by those who use this backend
        from aerospike import exception as aex

        self.url = url
        self.url_safe = mask_url(url)
        self.parts = parse_url(url)
        self._lua_dir = tempfile.TemporaryDirectory(prefix="utxoflow-lua-")
        timeout = self.parts.timeout_ms
        config: dict[str, Any] = {
            "hosts": list(self.parts.hosts),
            "lua": {"user_path": self._lua_dir.name},
            "policies": {
                "read": {"total_timeout": timeout},
                "write": {"total_timeout": timeout},
                "apply": {"total_timeout": timeout},
                "batch": {"total_timeout": timeout},
                "operate": {"total_timeout": timeout},
            },
        }
        try:
            self.client = aerospike.client(config)
            if self.parts.user:
                self.client.connect(self.parts.user, self.parts.password or "")
            else:
                self.client.connect()
        except aex.AerospikeError as e:
            self._lua_dir.cleanup()
            raise StorageError(f"cannot reach the Aerospike cluster at {self.url_safe}: {e.msg}") from e
        self.namespace = self.parts.namespace
        self.set = self.parts.set
        try:
            self._check_namespace()
            self.module = self._register()
        except BaseException:
            self.close()
            raise

    def _check_namespace(self) -> None:
        """ValueError naming what makes the namespace or the set unusable (see the
        invariants). A cluster that does not answer (a node going down in a rolling restart)
        is not refused for that: the check is skipped, with a warning, and the store's own
        requests meet whatever is wrong."""
        from aerospike import exception as aex

        policy = {"timeout": self.parts.timeout_ms}
        try:
            got = self.client.info_all(f"namespace/{self.namespace}", policy)
            sets = self.client.info_all(f"sets/{self.namespace}/{self.set}", policy)
        except aex.AerospikeError as e:
            log.warning("could not read the settings of namespace %r at %s (%s): not checked",
                        self.namespace, self.url_safe, e.msg)
            return
        # (the client raises rather than report a node's error: every answer here is a node's)
        problem = namespace_problem(
            self.namespace, self.set, {n: a[1] or "" for n, a in got.items()},
            {n: a[1] or "" for n, a in sets.items()},
        )
        if problem is not None:  # (a ValueError, as a URL that cannot work: nothing to wait for)
            raise ValueError(f"the Aerospike cluster at {self.url_safe} cannot keep the store: {problem}")

    def _register(self) -> str:
        from aerospike import exception as aex

        source = LUA_SOURCE.read_text()
        name = module_name(source)
        try:
            have = {m["name"] for m in self.client.udf_list()}
            if f"{name}.lua" not in have:
                path = Path(self._lua_dir.name) / f"{name}.lua"
                path.write_text(source)
                self.client.udf_put(str(path))
        except aex.AerospikeError as e:
            raise StorageError(f"cannot register the Lua module at {self.url_safe}: {e.msg}") from e
        return name

    def key(self, txid: bytes | bytearray, page: int = 0) -> Key:
        """A record's key: the txid, with the page index appended for child pages. A bytearray:
        the client takes a `bytes` key for a NUL-terminated string, so two txids that agree up
        to their first zero byte would be one record (tests/stores/test_aerospike_keys.py)."""
        return (self.namespace, self.set, bytearray(txid if page == 0 else txid + page.to_bytes(4, "little")))

    def apply(self, key: Key, function: str, args: list[Any]) -> Any:
        """Call one function of the module on one record."""
        from aerospike import exception as aex

        try:
            return self.client.apply(key, self.module, function, args)
        except aex.AerospikeError as e:
            raise StorageError(f"{function} on {self.url_safe} failed: {e.msg}") from e

    def batch(
        self, what: str, make: Callable[[int], Any], n: int, policy: dict[str, Any] | None = None,
        distinct: bool = False,
    ) -> list[Any]:
        """`batch_write` of the records `make(0)` … `make(n - 1)` (aerospike_helpers' batch
        records: Write, Apply, …) in batches of BATCH; each record's finished batch record, in
        order (see `_rounds` for busy keys and spreading). `distinct`: the caller's records
        are distinct (creates), not looked over for repeats."""
        from aerospike_helpers.batch import records as br

        def send(todo: list[int], policy: dict[str, Any], inline: bool | None) -> Sequence[Any]:
            records = [make(i) for i in todo]
            where = placed(policy, inline, [r.key for r in records])
            return self.client.batch_write(br.BatchRecords(records), where).batch_records  # type: ignore[no-any-return]

        return self._rounds(what, send, n, policy, distinct)

    def _rounds(
        self,
        what: str,
        send: Callable[[list[int], dict[str, Any], bool | None], Sequence[Any]],
        n: int,
        policy: dict[str, Any] | None,
        distinct: bool,
    ) -> list[Any]:
        """Items 0 … n-1 sent in batches of BATCH by `send(indexes, policy, inline)` (None:
        inline unless a record repeats); each item's finished batch record, in order. A record
        the server did not run because its key was busy (too many requests queued on one
        record: a popular parent) or its device overloaded is sent again, alone with the others
        like it, after a backoff that doubles (RETRIES times at most). A batch is spread over
        the server's service threads (`spread`) unless one record comes up in it more than
        SPREAD_REPEATS times; then, as every retry, it runs inline."""
        from aerospike import exception as aex

        out: list[Any] = [None] * n
        try:
            for part in chunked(range(n)):
                todo = list(part)
                for attempt in range(RETRIES):
                    inline = True if attempt > 0 else False if distinct else None
                    done = send(todo, policy or {}, inline)
                    if len(done) != len(todo):  # (batch_apply answers nothing when it reached no node)
                        raise StorageError(
                            f"{what} on {self.url_safe} failed: {len(done)} of {len(todo)} answered"
                        )
                    again = [i for i, r in zip(todo, done) if r.result in NOT_RUN]
                    for i, r in zip(todo, done):
                        if r.result not in NOT_RUN:
                            out[i] = r
                    if not again:
                        break
                    todo = again
                    time.sleep(BACKOFF * 2**attempt)
                else:
                    raise StorageError(
                        f"{what} on {self.url_safe}: {len(todo)} records stayed busy (hot keys)"
                    )
        except aex.AerospikeError as e:
            raise StorageError(f"{what} on {self.url_safe} failed: {e.msg}") from e
        return out

    def read_bins(
        self, keys: Sequence[Key], bins: Sequence[str] | None = None
    ) -> list[dict[str, Any] | None]:
        """Each key's bins (only `bins`, if named), None for a missing record; in batches."""
        from aerospike import exception as aex

        out: list[dict[str, Any] | None] = []
        try:
            for part in chunked(keys):
                got = (
                    self.client.batch_read(list(part))
                    if bins is None
                    else self.client.batch_read(list(part), list(bins))
                )
                for r in got.batch_records:
                    if r.result == 0 and r.record is not None:
                        out.append(r.record[2])
                    elif r.result == 2:  # not found
                        out.append(None)
                    else:
                        raise StorageError(
                            f"reading records on {self.url_safe} failed: result code {r.result}"
                        )
        except aex.AerospikeError as e:
            raise StorageError(f"reading records on {self.url_safe} failed: {e.msg}") from e
        return out

    def apply_many(self, calls: Sequence[tuple[Key, str, list[Any]]]) -> list[Any]:
        """Call the module once per (key, function, args) (`batch`): each call's result, in
        order. Calls on one record in one batch run one at a time, in no set order."""
        from aerospike_helpers.batch import records as br

        def make(i: int) -> Any:
            key, fn, args = calls[i]
            return br.Apply(key, self.module, fn, args)

        # no retry by the client: a Lua call that ran but whose answer was lost would run twice
        # (a spend then reports nothing new, a note of a reassign counts twice)
        done = self.batch("calling the store's rules", make, len(calls), {"max_retries": 0})
        return [self._answer(r, fn) for r, (_key, fn, _args) in zip(done, calls)]

    def apply_all(self, keys: Sequence[Key], fn: str, args: list[Any]) -> list[Any]:
        """`apply_many` of one call (function and arguments) on every key, with the client's
        `batch_apply`: the arguments are converted once and the call sent once per batch, not
        once per record (a block's set-mined is the same call on each of its transactions)."""

        def send(todo: list[int], policy: dict[str, Any], inline: bool | None) -> Sequence[Any]:
            part = [keys[i] for i in todo]
            where = placed(policy, inline, part)
            return self.client.batch_apply(part, self.module, fn, args, where).batch_records  # type: ignore[no-any-return]

        done = self._rounds("calling the store's rules", send, len(keys), {"max_retries": 0}, False)
        return [self._answer(r, fn) for r in done]

    def _answer(self, r: Any, fn: str) -> Any:
        """A finished Lua call's answer (its SUCCESS), or StorageError for a call that failed."""
        if r.result != 0 or r.record is None:
            raise StorageError(f"{fn} on {self.url_safe} failed: result code {r.result}")
        bins = r.record[2]
        if "FAILURE" in bins:
            raise StorageError(f"{fn} on {self.url_safe} failed: {bins['FAILURE']}")
        return bins.get("SUCCESS")

    def close(self) -> None:
        try:
            if self.client.is_connected():
                self.client.close()
        finally:
            self._lua_dir.cleanup()
