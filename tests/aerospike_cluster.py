"""A private Aerospike Community Edition cluster for the tests of losing a node: three `asd`
processes on loopback (mesh heartbeat, replication factor 2, namespace `test` in memory), made
and thrown away by the test. `AEROSPIKE_ASD` names the server binary (docs/aerospike.md says how
to build it); unset, those tests skip, saying so. They never touch the server of AEROSPIKE_HOSTS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port

ASD = os.environ.get("AEROSPIKE_ASD", "")
SKIP_REASON = (
    "AEROSPIKE_ASD is not set: the multi-node Aerospike tests start a cluster of their own "
    "(e.g. AEROSPIKE_ASD=/path/to/target/Linux-x86_64/bin/asd; docs/aerospike.md)"
)
needs_asd = pytest.mark.skipif(not ASD or not Path(ASD).is_file(), reason=SKIP_REASON)
NAMESPACE = "test"


def _conf(home: Path, ports: dict[str, int], seeds: list[int], cluster: str) -> str:
    mesh = "".join(f"\t\tmesh-seed-address-port 127.0.0.1 {p}\n" for p in seeds)
    return f"""service {{
\tproto-fd-max 1024
\twork-directory {home}/work
\tpidfile {home}/asd.pid
\tcluster-name {cluster}
}}
logging {{
\tfile {home}/aerospike.log {{
\t\tcontext any info
\t}}
}}
mod-lua {{
\tuser-path {home}/usr-udf
}}
network {{
\tservice {{
\t\taddress 127.0.0.1
\t\taccess-address 127.0.0.1
\t\tport {ports["service"]}
\t}}
\tfabric {{
\t\taddress 127.0.0.1
\t\tport {ports["fabric"]}
\t}}
\theartbeat {{
\t\tmode mesh
\t\taddress 127.0.0.1
\t\tport {ports["heartbeat"]}
{mesh}\t\tinterval 150
\t\ttimeout 10
\t}}
\tadmin {{
\t\taddress 127.0.0.1
\t\tport {ports["admin"]}
\t}}
}}
namespace {NAMESPACE} {{
\treplication-factor 2
\tdefault-ttl 0
\tnsup-period 10
\tstorage-engine memory {{
\t\tdata-size 512M
\t}}
}}
"""


class Cluster:
    """Three nodes, each in a directory of its own under `workdir`."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.workdir = workdir
        kinds = ("service", "fabric", "heartbeat", "admin")
        self.ports = [{k: free_port() for k in kinds} for _ in range(nodes)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self.cluster = f"utxoflow-test-{os.getpid()}-{time.monotonic_ns() % 10**6}"

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{p['service']}" for p in self.ports)

    def url(self, set_name: str = "txs") -> str:
        return f"aerospike://{self.hosts}/{NAMESPACE}?set={set_name}"

    def start(self) -> None:
        seeds = [p["heartbeat"] for p in self.ports]
        for k, ports in enumerate(self.ports):
            home = self.workdir / f"node{k}"
            for d in ("work/smd", "usr-udf"):
                (home / d).mkdir(parents=True, exist_ok=True)
            (home / "aerospike.conf").write_text(_conf(home, ports, seeds, self.cluster))
            log = open(home / "stdout", "ab")
            self.procs[k] = subprocess.Popen(
                [ASD, "--foreground", "--config-file", str(home / "aerospike.conf")],
                cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            log.close()
        self.until_size(len(self.ports))

    def stats(self, k: int) -> dict[str, str]:
        """Node k's `statistics` (asked of that node alone)."""
        import aerospike

        c = aerospike.client({"hosts": [("127.0.0.1", self.ports[k]["service"])]}).connect()
        try:
            (name,) = [n["node_name"] for n in c.get_node_names() if n["port"] == self.ports[k]["service"]]
            text = str(c.info_single_node("statistics", name)).strip().split("\t")[-1]
        finally:
            c.close()
        return dict(kv.split("=", 1) for kv in text.split(";") if "=" in kv)

    def live(self) -> list[int]:
        return [k for k, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def until_size(self, n: int, timeout: float = 60) -> None:
        """Until every live node sees a cluster of `n` (migrations may still run)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if all(self.stats(k)["cluster_size"] == str(n) for k in self.live()):
                    return
            except Exception:  # (a node still starting)
                pass
            assert time.monotonic() < deadline, f"the cluster did not reach {n} nodes: {self.logs()}"
            time.sleep(0.2)

    def migrations_left(self) -> int:
        """Partitions the live nodes still have to migrate."""
        return sum(int(self.stats(k).get("migrate_partitions_remaining", "0")) for k in self.live())

    def kill(self, k: int) -> None:
        """SIGKILL node k: its replicas are gone; the others hold a copy of each partition."""
        p = self.procs[k]
        assert p is not None
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)

    def logs(self) -> str:
        paths = [self.workdir / f"node{k}" / "aerospike.log" for k in range(len(self.ports))]
        return "".join(f"\n--- {p.parent.name} ---\n{p.read_text(errors='replace')[-1500:]}"
                       for p in paths if p.exists())

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


@pytest.fixture(name="cluster")
def cluster_fixture(tmp_path: Path) -> Iterator[Cluster]:
    """A private three-node cluster (import it to use it)."""
    c = Cluster(tmp_path / "aerospike")
    try:
        c.start()
        yield c
    finally:
        c.stop()

