"""The deployment examples in deploy/ use only real settings and real `utxo` commands, and keep
the properties deploy/README.md promises (workers scale, one beat, Flower behind basic auth,
Prometheus scrapes what serves metrics, Grafana's dashboard finds its datasource, nothing but
Flower and Grafana published, on loopback; in Kubernetes, Prometheus and Grafana run compose's own
files and nothing is exposed outside the cluster). Plain parsing: no Docker, no cluster."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

import celeryconfig
from stores.utxo.aerospike.client import parse_url
from tests.conftest import ROOT
from workers.cli import cli
from workers.settings import Settings, env_name, load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SETTINGS = {env_name(f) for f in Settings.model_fields}
QUEUES = {q.name for q in celeryconfig.task_queues}
SHELL_OPS = {"|", "||", "&&", ";", "&"}

COMPOSE: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
OVERRIDES = [None, "aerospike/compose.yaml", "aerospike-cluster/compose.yaml"]  # (None: compose.yaml alone)
K8S: list[dict[str, Any]] = [
    doc for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for doc in yaml.safe_load_all(p.read_text()) if doc
]


def k8s(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in K8S if d["kind"] == kind}


def pod(deployment: str) -> dict[str, Any]:
    spec: dict[str, Any] = k8s("Deployment")[deployment]["spec"]["template"]["spec"]
    return spec


def parse_utxo(args: list[str]) -> click.Context:
    """Parse `utxo ARGS` as the real CLI does, down to the leaf command, without running it: a
    UsageError names an unknown command or option, or a bad value."""
    cmd: click.Command = cli
    ctx = cmd.make_context("utxo", list(args))
    while isinstance(cmd, click.Group):
        # Click >= 8.2 keeps the subcommand name in _protected_args (protected_args is deprecated).
        head = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
        name, sub, rest = cmd.resolve_command(ctx, [*head, *ctx.args])  # unknown name: UsageError
        assert name is not None and sub is not None
        cmd, ctx = sub, sub.make_context(name, rest, parent=ctx)
    return ctx


def utxo_argvs(tokens: list[str]) -> Iterator[list[str]]:
    """The arguments of every `utxo` invocation in a command line (after docker run, kubectl
    exec --, …), split at shell operators; `-U utxo` is an option's value, not a command."""
    segment: list[str] = []
    for tok in [*tokens, ";"]:
        if tok not in SHELL_OPS:
            segment.append(tok)
            continue
        for i, t in enumerate(segment):
            if t == "utxo" and (i == 0 or not segment[i - 1].startswith("-")):
                yield segment[i + 1 :]
                break
        segment = []


def yaml_commands() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every compose service and Kubernetes container."""
    for name, svc in SERVICES.items():
        cmd = svc.get("command")
        if cmd:
            yield f"compose {name}", cmd if isinstance(cmd, list) else shlex.split(cmd)
    for name in k8s("Deployment"):
        for c in pod(name)["containers"]:
            yield f"k8s {name}", [*c.get("command", []), *c.get("args", [])]


def readme_commands() -> Iterator[tuple[bool, list[str]]]:
    """(prose, tokens) of deploy/README.md: lines of fenced blocks (to be run as they are), and
    inline code spans (prose: `utxo block` may leave out its required HASH)."""
    text = (DEPLOY / "README.md").read_text()
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            yield False, shlex.split(line, comments=True)
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)):
        yield True, shlex.split(span)


def test_celery_finds_the_app_by_its_contract_name() -> None:
    """`celery -A workers.app worker` works too (CONTRACT.md): that name loads the app the
    workers run, with every task of the pipeline and the worker's hooks."""
    import sys

    code = ("import json; from workers.app import app; app.loader.import_default_modules(); "
            "print(json.dumps(sorted(t for t in app.tasks if t.startswith('utxoflow.'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [
        "utxoflow.block.arrived", "utxoflow.chunk.create", "utxoflow.chunk.mine", "utxoflow.chunk.spend",
        "utxoflow.prune.chunk", "utxoflow.prune.run", "utxoflow.recovery.handle", "utxoflow.recovery.requeue",
        "utxoflow.tx.arrived", "utxoflow.txs.arrived",
    ]
    r = subprocess.run([sys.executable, "-m", "celery", "-A", "workers.app", "report"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and "transport:redis" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("rogue", ["celeryconfig.py", "tasks.py"])
def test_a_module_of_the_same_name_where_a_worker_starts_is_refused(tmp_path: Path, rogue: str) -> None:
    """`celeryconfig` and `tasks` are names other projects use too, and Celery puts the directory
    a worker starts in first on sys.path: another `celeryconfig.py` there would configure the
    worker silently (here: another broker). The worker refuses to start instead, in one line
    naming the file, exit 2."""
    import os
    import sys

    (tmp_path / rogue).write_text('broker_url = "redis://elsewhere.invalid:1/0"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UTXO_STORE_WAIT": "0"}
    r = subprocess.run([sys.executable, "-m", "workers.cli", "worker", "-n", "rogue@test"], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"utxo: error: the module {rogue[:-3]!r} Python finds first is {tmp_path.resolve() / rogue}, "
        f"not utxoflow's (in {ROOT}): start from another directory, or rename that module"
    ], r.stderr


def test_every_utxo_variable_is_a_setting() -> None:
    used: set[str] = set()
    for p in DEPLOY.rglob("*"):
        if p.is_file():
            used |= set(re.findall(r"\bUTXO_[A-Z0-9_]*[A-Z0-9*]", p.read_text()))
    assert used, "no UTXO_ variable found: the pattern is broken"
    unknown = sorted(
        n for n in used
        if (n.endswith("_*") and not any(s.startswith(n[:-1]) for s in SETTINGS))
        or (not n.endswith("_*") and n not in SETTINGS)
    )
    assert not unknown, f"not settings of workers/settings.py: {unknown}"


def test_the_settings_given_are_valid() -> None:
    envs = {f"compose {n}": s.get("environment") or {} for n, s in SERVICES.items()}
    envs["k8s ConfigMap"] = next(iter(k8s("ConfigMap").values()))["data"]
    for env in envs.values():
        given = {k.removeprefix("UTXO_").lower(): v for k, v in env.items() if k.startswith("UTXO_")}
        load_settings(**given)  # a bad value raises, naming the variable
    assert all(isinstance(v, str) for v in envs["k8s ConfigMap"].values()), "ConfigMap values must be strings"


@pytest.mark.parametrize("where,argv", list(yaml_commands()), ids=lambda v: v if isinstance(v, str) else "")
def test_yaml_runs_real_utxo_commands(where: str, argv: list[str]) -> None:
    for args in utxo_argvs(argv):
        try:
            ctx = parse_utxo(args)
        except click.UsageError as e:
            pytest.fail(f"{where}: `utxo {shlex.join(args)}`: {e.format_message()}")
        if ctx.info_name == "worker":
            assert set(ctx.params["queues"].split(",")) <= QUEUES, where


def test_readme_uses_real_utxo_commands() -> None:
    bad, seen = [], 0
    for prose, tokens in readme_commands():
        for args in utxo_argvs(tokens):
            seen += 1
            try:
                parse_utxo(args)
            except (click.MissingParameter, click.exceptions.NoArgsIsHelpError):
                if not prose:
                    bad.append(f"`utxo {shlex.join(args)}` is incomplete")
            except click.UsageError as e:
                bad.append(f"`utxo {shlex.join(args)}`: {e.format_message()}")
    assert seen and not bad, bad


def test_compose_workers_can_scale() -> None:
    worker = SERVICES["worker"]
    # A fixed name or published host port makes `--scale` fail; a shared host name (fixed, or
    # the host's network) lets one worker take over another's live lease.
    for key in ("container_name", "hostname", "ports"):
        assert key not in worker, f"worker sets {key}"
    assert worker.get("network_mode") != "host"
    assert worker.get("stop_grace_period"), "tasks ack late: give a block task time to finish"
    assert SERVICES["beat"].get("deploy", {}).get("replicas", 1) == 1


def test_k8s_workers_and_beat() -> None:
    worker, beat = k8s("Deployment")["utxo-worker"], k8s("Deployment")["utxo-beat"]
    assert not pod("utxo-worker").get("hostNetwork")
    assert pod("utxo-worker")["terminationGracePeriodSeconds"] >= 300
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert worker["spec"]["replicas"] >= 1
    kustomization = next(iter(d for d in K8S if d["kind"] == "Kustomization"))
    assert all((DEPLOY / "k8s" / r).is_file() for r in kustomization["resources"])
    assert "secret.example.yaml" not in kustomization["resources"]


def basic_auth_ok(value: Any) -> bool:
    return isinstance(value, str) and all(
        ":" in pair and pair.split(":", 1)[0] and pair.split(":", 1)[1] for pair in value.split(",")
    )


def test_compose_flower_has_basic_auth() -> None:
    flower = SERVICES["flower"]
    assert flower["command"][:2] == ["utxo", "flower"], "`utxo flower` refuses to listen openly"
    env = flower.get("environment") or {}
    assert "UTXO_FLOWER_BASIC_AUTH" not in env, "the env file's value must not be overridden"
    files = flower["env_file"] if isinstance(flower["env_file"], list) else [flower["env_file"]]
    values = {}
    for f in files:
        example = DEPLOY / f"{f['path'] if isinstance(f, dict) else f}.example"
        values |= dict(line.split("=", 1) for line in example.read_text().splitlines() if "=" in line
                       and not line.startswith("#"))
    assert basic_auth_ok(values.get("UTXO_FLOWER_BASIC_AUTH")), values


def test_k8s_flower_has_basic_auth() -> None:
    secrets = {
        d["metadata"]["name"]: d["stringData"]
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "secret.example.yaml").read_text())
    }
    (container,) = pod("utxo-flower")["containers"]
    assert container["command"][:2] == ["utxo", "flower"]
    refs = [e["secretRef"]["name"] for e in container["envFrom"] if "secretRef" in e]
    assert any(basic_auth_ok(secrets.get(r, {}).get("UTXO_FLOWER_BASIC_AUTH")) for r in refs), refs
    assert k8s("Service")["utxo-flower"]["spec"].get("type", "ClusterIP") == "ClusterIP"


def test_the_aerospike_overlays_point_the_workers_at_the_server_they_add() -> None:
    """deploy/aerospike: the compose override and the Kubernetes overlay add a server that runs
    aerospike.conf, and their UTXO_STORE_URL names that server and the namespace the file makes;
    the settings they give are valid."""
    here = DEPLOY / "aerospike"
    conf = (here / "aerospike.conf").read_text()
    namespaces = set(re.findall(r"^namespace (\S+) \{", conf, flags=re.M))
    assert "nsup-period" in conf and len(namespaces) == 1
    override = yaml.safe_load((here / "compose.yaml").read_text())["services"]
    server = override["aerospike"]
    # (an override's relative paths are the first file's: deploy/)
    assert "./aerospike/aerospike.conf:/etc/aerospike/aerospike.conf:ro" in server["volumes"]
    assert server["command"][-1] == "/etc/aerospike/aerospike.conf"
    compose_url = override["worker"]["environment"]["UTXO_STORE_URL"]
    assert override["worker"]["depends_on"]["aerospike"]["condition"] == "service_healthy"
    overlay = yaml.safe_load((here / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../k8s", "aerospike.yaml"]
    assert overlay["configMapGenerator"][0]["files"] == ["aerospike.conf"]
    ops = yaml.safe_load(overlay["patches"][0]["patch"])
    patched = {op["path"].rsplit("/", 1)[1]: op["value"] for op in ops}
    docs = {d["kind"]: d for d in yaml.safe_load_all((here / "aerospike.yaml").read_text())}
    mounted = docs["StatefulSet"]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert mounted == overlay["configMapGenerator"][0]["name"]
    service = docs["Service"]["metadata"]["name"]
    for url, host in ((compose_url, "aerospike"), (patched["UTXO_STORE_URL"], service)):
        parts = parse_url(url)
        assert parts.hosts == ((host, 3000),) and {parts.namespace} == namespaces, url
    data = {**next(iter(k8s("ConfigMap").values()))["data"], **patched}
    for env in (override["worker"]["environment"], data):
        given = {k.removeprefix("UTXO_").lower(): v for k, v in env.items() if k.startswith("UTXO_")}
        settings = load_settings(**given)
        assert settings.batch_size <= 8192  # an Aerospike record's slots stay under its size limit


def test_the_aerospike_cluster_overlays_run_three_nodes_that_find_each_other() -> None:
    """deploy/aerospike-cluster: one aerospike.conf for every node, replication factor 2, its
    mesh seeds exactly the StatefulSet's pods behind its headless Service (published before they
    are ready) and compose's aliases for its three servers; the workers' UTXO_STORE_URL lists
    every node; at most one node down by choice (PodDisruptionBudget), one node per host."""
    here = DEPLOY / "aerospike-cluster"
    conf = (here / "aerospike.conf").read_text()
    namespaces = set(re.findall(r"^namespace (\S+) \{", conf, flags=re.M))
    assert len(namespaces) == 1 and "nsup-period" in conf and "default-ttl 0" in conf
    assert re.findall(r"^\s*replication-factor (\d+)", conf, flags=re.M) == ["2"]
    seeds = set(re.findall(r"mesh-seed-address-port (\S+) 3002", conf))
    docs = {d["kind"]: d for d in yaml.safe_load_all((here / "statefulset.yaml").read_text()) if d}
    sts, svc, pdb = docs["StatefulSet"], docs["Service"], docs["PodDisruptionBudget"]
    name, replicas = sts["metadata"]["name"], sts["spec"]["replicas"]
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    pods = {f"{name}-{k}.{svc['metadata']['name']}" for k in range(replicas)}
    assert replicas == 3 and seeds == pods
    assert pdb["spec"]["maxUnavailable"] == 1
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (spread,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    overlay = yaml.safe_load((here / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../k8s", "statefulset.yaml"]
    generated = overlay["configMapGenerator"][0]
    assert generated["files"] == ["aerospike.conf"]
    assert sts["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == generated["name"]
    ops = yaml.safe_load(overlay["patches"][0]["patch"])
    patched = {op["path"].rsplit("/", 1)[1]: op["value"] for op in ops}
    override = yaml.safe_load((here / "compose.yaml").read_text())["services"]
    servers = {k: v for k, v in override.items() if k.startswith("aerospike")}
    aliases = {a for v in servers.values() for a in v["networks"]["default"]["aliases"]}
    assert aliases == pods and len(servers) == replicas
    for v in servers.values():
        assert "./aerospike-cluster/aerospike.conf:/etc/aerospike/aerospike.conf:ro" in v["volumes"]
    assert set(override["worker"]["depends_on"]) == set(servers)
    for url in (patched["UTXO_STORE_URL"], override["worker"]["environment"]["UTXO_STORE_URL"]):
        parts = parse_url(url)
        assert set(parts.hosts) == {(p, 3000) for p in pods} and {parts.namespace} == namespaces, url
    data = {**next(iter(k8s("ConfigMap").values()))["data"], **patched}
    given = {k.removeprefix("UTXO_").lower(): v for k, v in data.items() if k.startswith("UTXO_")}
    assert load_settings(**given).batch_size <= 8192


# --- metrics: Prometheus, Grafana ---------------------------------------------------------------

PROMETHEUS: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "utxoflow.json"
SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


def first_utxo(argv: list[str]) -> click.Context | None:
    """The parsed first `utxo` invocation of a command line (None: there is none)."""
    return next((parse_utxo(args) for args in utxo_argvs(argv)), None)


def metrics_port(ctx: click.Context | None, env: dict[str, Any]) -> int | None:
    """The port a container of this command and environment serves /metrics on (None: none)."""
    if ctx is None:
        return None
    port: int | None = None
    if ctx.info_name == "worker":
        given = {k.removeprefix("UTXO_").lower(): v for k, v in env.items() if k.startswith("UTXO_")}
        port = ctx.params["metrics_port"]
        port = load_settings(**given).metrics_port if port is None else port  # --metrics-port wins
    elif ctx.info_name in ("metrics", "flower"):  # Flower serves /metrics beside its UI
        port = ctx.params["port"]
    return port or None


def compose_metrics_ports() -> dict[str, int]:
    """compose service: the port it serves /metrics on, from its own command and settings."""
    ports = {}
    for name, svc in SERVICES.items():
        cmd = svc.get("command") or []
        port = metrics_port(first_utxo(cmd if isinstance(cmd, list) else shlex.split(cmd)),
                            svc.get("environment") or {})
        if port:
            ports[name] = port
    return ports


def bind_mounts(svc: dict[str, Any]) -> dict[str, str]:
    """target: source (relative to the compose file) of a service's bind mounts."""
    mounts = {}
    for v in svc.get("volumes", []):
        source, target = (v["source"], v["target"]) if isinstance(v, dict) else v.split(":")[:2]
        if source.startswith("."):
            mounts[target] = source
    return mounts


def test_prometheus_scrapes_every_metrics_port_compose_serves() -> None:
    served = compose_metrics_ports()
    assert set(served) == {"worker", "metrics", "flower"}, served
    assert "UTXO_STATE_URL" in SERVICES["worker"]["environment"], "the worker lost x-app's settings"
    scraped: dict[str, int] = {}
    for job in PROMETHEUS["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics", job["job_name"]
        for sd in job.get("dns_sd_configs", []):
            # Docker's DNS answers a service's name with an A record per replica.
            assert sd["type"] == "A", job["job_name"]
            scraped |= {name: sd["port"] for name in sd["names"]}
        for static in job.get("static_configs", []):
            scraped |= {host: int(port) for host, port in (t.rsplit(":", 1) for t in static["targets"])}
    assert scraped == served, "scraped (host: port) differs from what compose serves"
    assert PROMETHEUS["global"]["scrape_interval"] == "15s"
    # Only one `utxo metrics` is needed; a worker port must not be published (it would stop --scale).
    assert SERVICES["metrics"].get("deploy", {}).get("replicas", 1) == 1
    prometheus = SERVICES["prometheus"]
    assert bind_mounts(prometheus) == {"/etc/prometheus/prometheus.yml": "./prometheus/prometheus.yml"}
    assert any(v.split(":")[1] == "/prometheus" for v in prometheus["volumes"]), "no volume for its data"


def test_bind_mounts_exist() -> None:
    """Every file a compose service mounts exists, an override's too: Compose resolves every
    file's relative paths from the first file's directory (deploy/), not the override's own."""
    overrides = [yaml.safe_load((DEPLOY / o).read_text())["services"] for o in OVERRIDES if o]
    for services in (SERVICES, *overrides):
        for name, svc in services.items():
            for target, source in bind_mounts(svc).items():
                # Docker makes a directory for a missing source and mounts that, silently.
                assert (DEPLOY / source).exists(), f"{name}: {source} (for {target}) is missing"


def datasources(node: Any) -> Iterator[Any]:
    """Every `datasource` a dashboard (or a part of one) names."""
    if isinstance(node, dict):
        if "datasource" in node:
            yield node["datasource"]
        for v in node.values():
            yield from datasources(v)
    elif isinstance(node, list):
        for v in node:
            yield from datasources(v)


def test_grafana_loads_the_dashboard_with_its_datasource() -> None:
    assert DASHBOARD.is_file(), f"{DASHBOARD} is missing: compose mounts it into Grafana"
    dashboard = json.loads(DASHBOARD.read_text())
    used = list(datasources(dashboard))
    assert used, "the dashboard names no datasource"
    provisioning = GRAFANA / "provisioning"
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    bad = [d for d in used if d != {"type": ds["type"], "uid": ds["uid"]}]
    assert not bad, f"panels name datasources Grafana is not given: {bad[:3]}"
    assert ds["isDefault"] and ds["jsonData"]["timeInterval"] == PROMETHEUS["global"]["scrape_interval"]
    url = urlsplit(ds["url"])
    assert url.hostname == "prometheus" and url.hostname in SERVICES and url.port == 9090, ds["url"]

    grafana = SERVICES["grafana"]
    mounts = bind_mounts(grafana)
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "utxoflow.yaml").read_text())["providers"]
    assert provider["type"] == "file"
    assert mounts[f"{provider['options']['path']}/utxoflow.json"] == "./grafana/utxoflow.json"
    for sub in ("datasources", "dashboards"):
        assert mounts[f"/etc/grafana/provisioning/{sub}"] == f"./grafana/provisioning/{sub}"
    assert all(v.endswith(":ro") for v in grafana["volumes"] if v.startswith(".")), "mount read-only"
    home = grafana["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home is None or home in mounts, home
    password = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert re.fullmatch(r"\$\{[A-Z_]+:-[^}]+\}", password), "the admin password comes from the shell or .env"


def test_only_flower_and_grafana_are_published_on_loopback() -> None:
    override = yaml.safe_load((DEPLOY / "aerospike" / "compose.yaml").read_text())["services"]
    published = set()
    for name, svc in [*SERVICES.items(), *override.items()]:
        assert svc.get("network_mode") != "host", f"{name} shares the host's network"
        for port in svc.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else (
                str(port).rsplit(":", 2)[0] if str(port).count(":") == 2 else None)
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published.add(name)
    assert published == {"flower", "grafana"}


def test_k8s_pods_are_scraped_where_they_serve_metrics() -> None:
    data = next(iter(k8s("ConfigMap").values()))["data"]
    served = {}
    for name, deployment in k8s("Deployment").items():
        template = deployment["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        (container,) = template["spec"]["containers"]
        env = {**data, **{e["name"]: e["value"] for e in container.get("env", [])}}
        assert all(isinstance(v, str) for v in env.values()), f"{name}: env values must be strings"
        port = metrics_port(first_utxo([*container.get("command", []), *container.get("args", [])]), env)
        if port is None:
            assert not any(a in annotations for a in SCRAPE_ANNOTATIONS), name
            continue
        served[name] = port
        declared = {p["containerPort"] for p in container.get("ports", [])}
        assert port in declared, f"{name}: {port} is not a containerPort"
        assert {a: annotations.get(a) for a in SCRAPE_ANNOTATIONS} == {
            "prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"
        }, name
    assert set(served) == {"utxo-worker", "utxo-metrics", "utxo-flower"}, served
    worker_ports = {p["name"]: p["containerPort"] for p in pod("utxo-worker")["containers"][0]["ports"]}
    assert worker_ports["metrics"] == served["utxo-worker"]
    assert k8s("Deployment")["utxo-metrics"]["spec"]["replicas"] == 1
    # The pods are annotated, so a Service must not be: a Prometheus that discovers both would
    # scrape its pods twice, and the dashboard's sums would double.
    for name, service in k8s("Service").items():
        assert "prometheus.io/scrape" not in service["metadata"].get("annotations", {}), name
    (metrics_port_,) = k8s("Service")["utxo-metrics"]["spec"]["ports"]
    assert metrics_port_["port"] == served["utxo-metrics"] and metrics_port_["targetPort"] == "metrics"

    (job,) = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())["scrape_configs"]
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    # The Role of k8s-monitoring lets it list the pods of its own namespace, not every namespace's.
    assert sd["namespaces"] == {"own_namespace": True}, "discover the pods of Prometheus's namespace"
    # The dashboard's rate()s over [1m] need several samples a minute, as compose's Prometheus takes.
    assert job["scrape_interval"] == PROMETHEUS["global"]["scrape_interval"]
    sources = {tuple(r.get("source_labels", [])) for r in job["relabel_configs"]}
    for a in SCRAPE_ANNOTATIONS:
        label = "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-z0-9]", "_", a)
        assert any(label in s for s in sources), f"{a} is not honoured"


# --- Kubernetes with Prometheus and Grafana: deploy/kustomization.yaml ---------------------------

KUSTOMIZATION: dict[str, Any] = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
MONITORING: list[dict[str, Any]] = [
    doc for r in KUSTOMIZATION["resources"] if (DEPLOY / r).is_file()
    for doc in yaml.safe_load_all((DEPLOY / r).read_text()) if doc
]
AEROSPIKE_K8S: list[dict[str, Any]] = [
    doc for doc in yaml.safe_load_all((DEPLOY / "aerospike" / "aerospike.yaml").read_text()) if doc
]
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
MONITORING_SECRETS = DEPLOY / "k8s-monitoring" / "secret.example.yaml"


def monitoring(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in MONITORING if d["kind"] == kind}


def generated() -> dict[str, dict[str, Path]]:
    """ConfigMap name: {key: the file it holds}, from the kustomization's configMapGenerator."""
    maps: dict[str, dict[str, Path]] = {}
    for gen in KUSTOMIZATION.get("configMapGenerator", []):
        files = {}
        for f in gen.get("files", []):
            key, _, path = f.rpartition("=")  # `key=path`, or `path` (the key is its name)
            files[key or Path(path).name] = DEPLOY / path
        maps[gen["name"]] = files
    return maps


def monitoring_pod(image: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod template, container) of the one workload of the kustomization that runs IMAGE."""
    ((template, container),) = [
        (d["spec"]["template"], c) for d in MONITORING if d["kind"] in WORKLOADS
        for c in d["spec"]["template"]["spec"]["containers"] if c["image"].rsplit(":", 1)[0] == image
    ]
    return template, container


def mounted_files(template: dict[str, Any], container: dict[str, Any]) -> dict[str, Path]:
    """Path in the container: the file of deploy/ it is, for every generated ConfigMap mounted."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    maps = generated()
    files = {}
    for m in container.get("volumeMounts", []):
        cm = volumes.get(m["name"], {}).get("configMap")  # not there: a volumeClaimTemplate
        if cm is None:
            continue
        held = maps.get(cm["name"], {})
        items = {i["key"]: i["path"] for i in cm.get("items", [])} or {k: k for k in held}
        for key, path in items.items():
            if "subPath" not in m:
                files[f"{m['mountPath']}/{path}"] = held[key]
            elif m["subPath"] == path:
                files[m["mountPath"]] = held[key]
    return files


def test_the_monitoring_kustomization_names_files_that_exist() -> None:
    resources = KUSTOMIZATION["resources"]
    assert {"k8s", "aerospike"} & set(resources), "it adds Prometheus and Grafana to the app of k8s/"
    for r in resources:
        assert (DEPLOY / r).is_file() or (DEPLOY / r / "kustomization.yaml").is_file(), f"{r} is missing"
    # The user makes the Secrets: change-me must never ship.
    assert not any(r.endswith("secret.example.yaml") for r in resources), resources
    assert "secretGenerator" not in KUSTOMIZATION and not monitoring("Secret")
    assert MONITORING_SECRETS.is_file()
    maps = generated()
    assert maps, "no ConfigMap generated"
    for name, files in maps.items():
        for key, source in files.items():
            # kustomize refuses a file outside its kustomization's directory.
            assert ".." not in source.relative_to(DEPLOY).parts, f"{name}: {source}"
            assert source.is_file(), f"{name}: {source} (key {key}) is missing"


def test_monitoring_pods_use_only_configmaps_that_exist() -> None:
    defined = set(generated()) | {
        d["metadata"]["name"] for d in [*K8S, *MONITORING] if d["kind"] == "ConfigMap"}
    used = set()
    for d in MONITORING:
        if d["kind"] not in WORKLOADS:
            continue
        spec = d["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            sources = [v, *v.get("projected", {}).get("sources", [])]
            used |= {s["configMap"]["name"] for s in sources if "configMap" in s}
        for c in spec["containers"]:
            used |= {e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e}
    assert used, "Prometheus and Grafana mount no ConfigMap"
    assert used <= defined, f"neither generated nor defined: {sorted(used - defined)}"
    assert set(generated()) <= used, f"generated, used by no pod: {sorted(set(generated()) - used)}"


def test_k8s_prometheus_runs_the_kubernetes_job() -> None:
    template, container = monitoring_pod("prom/prometheus")
    assert container["image"] == SERVICES["prometheus"]["image"], "the same Prometheus as compose's"
    args = dict(a.removeprefix("--").split("=", 1) for a in container.get("args", []) if "=" in a)
    config = args.get("config.file", "/etc/prometheus/prometheus.yml")  # the image's default
    assert mounted_files(template, container).get(config) == DEPLOY / "prometheus" / "kubernetes.yml", config
    data = args.get("storage.tsdb.path", "/prometheus")
    assert data in {m["mountPath"] for m in container["volumeMounts"]}, "its data needs a volume"
    # The image's user is a name (nobody): runAsNonRoot refuses to start it unless given a number.
    user = container.get("securityContext", {}).get(
        "runAsUser", template["spec"].get("securityContext", {}).get("runAsUser"))
    assert isinstance(user, int) and user != 0
    # Discovered through the annotated pods only: an annotated Service would be scraped twice.
    for name, d in [*monitoring("Service").items(), *((n, w["spec"]["template"]) for n, w in (
            *monitoring("Deployment").items(), *monitoring("StatefulSet").items()))]:
        assert "prometheus.io/scrape" not in d["metadata"].get("annotations", {}), name


def test_k8s_prometheus_may_list_and_watch_pods_and_no_more() -> None:
    template, _ = monitoring_pod("prom/prometheus")
    account = template["spec"].get("serviceAccountName")
    assert account in monitoring("ServiceAccount"), "discovery lists pods as a ServiceAccount of its own"
    bindings = [
        b for b in MONITORING if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b.get("subjects", []))
    ]
    assert bindings, f"no role is bound to {account}"
    granted = set()
    for b in bindings:
        if b["kind"] == "ClusterRoleBinding":  # a RoleBinding's ServiceAccount is its own namespace's
            assert all(s.get("namespace") for s in b["subjects"] if s["kind"] == "ServiceAccount"), b
        role = monitoring(b["roleRef"]["kind"])[b["roleRef"]["name"]]
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, f"more than reading: {rule}"
            if "" in rule.get("apiGroups", []):
                granted |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    assert {("pods", "list"), ("pods", "watch")} <= granted, granted
    if all(b["kind"] == "RoleBinding" for b in bindings):
        # Allowed in its namespace only: discovery must not ask for every namespace's pods.
        (job,) = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())["scrape_configs"]
        assert all(sd.get("namespaces", {}).get("own_namespace") for sd in job["kubernetes_sd_configs"])


def test_k8s_grafana_runs_compose_provisioning_and_dashboard() -> None:
    template, container = monitoring_pod("grafana/grafana")
    grafana = SERVICES["grafana"]
    assert container["image"] == grafana["image"], "the same Grafana as compose's"
    files = mounted_files(template, container)
    # compose's bind mounts, file by file: the same files at the same paths.
    expected = {}
    for target, source in bind_mounts(grafana).items():
        path = DEPLOY / source
        expected |= {f"{target}/{f.name}": f for f in path.iterdir() if f.is_file()} if path.is_dir() else {
            target: path}
    assert expected and {t: files.get(t) for t in expected} == expected

    env = {e["name"]: e for e in container.get("env", [])}
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH", {}).get("value")
    assert home is None or files.get(home) == DASHBOARD, home
    providers = [p for f, src in files.items() if f.startswith("/etc/grafana/provisioning/dashboards/")
                 for p in yaml.safe_load(src.read_text())["providers"]]
    loaded = [src for p in providers for f, src in files.items() if f.startswith(f"{p['options']['path']}/")]
    assert DASHBOARD in loaded, "no provider loads the dashboard"
    (ds,) = [d for f, src in files.items() if f.startswith("/etc/grafana/provisioning/datasources/")
             for d in yaml.safe_load(src.read_text())["datasources"]]
    used = list(datasources(json.loads(DASHBOARD.read_text())))
    assert used and all(d == {"type": ds["type"], "uid": ds["uid"]} for d in used), "the dashboard's uid"

    # The datasource's URL is the Service of the Prometheus pod, on its port.
    url = urlsplit(ds["url"])
    service = monitoring("Service").get(url.hostname or "")
    assert service, f"{ds['url']}: no Service {url.hostname}"
    prom_template, prom = monitoring_pod("prom/prometheus")
    assert service["spec"]["selector"].items() <= prom_template["metadata"]["labels"].items()
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    assert port["targetPort"] in {q["name"] for q in prom["ports"] if q["containerPort"] == 9090}
    (grafana_service,) = [s for s in monitoring("Service").values()
                          if s["spec"]["selector"].items() <= template["metadata"]["labels"].items()]
    assert [p["port"] for p in grafana_service["spec"]["ports"]] == [3000]

    # The admin password is the user's Secret, made from the example left out of the kustomization.
    password = env["GF_SECURITY_ADMIN_PASSWORD"]
    assert "value" not in password, "the admin password comes from a Secret"
    ref = password["valueFrom"]["secretKeyRef"]
    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(MONITORING_SECRETS.read_text())}
    assert secrets[ref["name"]]["stringData"][ref["key"]], ref


def k8s_workloads() -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind name, pod spec) of every Kubernetes workload of deploy/."""
    for d in [*K8S, *MONITORING, *AEROSPIKE_K8S]:
        if d["kind"] in WORKLOADS:
            yield f"{d['kind']} {d['metadata']['name']}", d["spec"]["template"]["spec"]


def test_k8s_exposes_nothing_outside_the_cluster() -> None:
    for d in [*K8S, *MONITORING, *AEROSPIKE_K8S]:
        name = f"{d['kind']} {d.get('metadata', {}).get('name')}"
        assert d["kind"] not in ("Ingress", "Gateway", "HTTPRoute", "Route"), name
        if d["kind"] == "Service":
            assert d["spec"].get("type", "ClusterIP") == "ClusterIP", name
            assert not d["spec"].get("externalIPs"), name
    for name, spec in k8s_workloads():
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), f"{name}: {key}"
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            assert not any("hostPort" in p for p in c.get("ports", [])), f"{name}: hostPort"


def test_k8s_images_are_pinned() -> None:
    for name, spec in k8s_workloads():
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            image = c["image"]
            tag = image.rsplit("/", 1)[-1].partition(":")[2]  # a registry's :port is not the tag
            assert "@sha256:" in image or tag not in ("", "latest"), f"{name}: {image}"
    for k in (yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text()), KUSTOMIZATION):
        assert all(str(i.get("newTag", "")) != "latest" for i in k.get("images", [])), k["images"]


def test_k8s_app_and_monitoring_pods_run_unprivileged_with_bounded_memory() -> None:
    for d in [*K8S, *MONITORING]:
        if d["kind"] not in WORKLOADS:
            continue
        name, spec = f"{d['kind']} {d['metadata']['name']}", d["spec"]["template"]["spec"]
        assert spec.get("securityContext", {}).get("runAsNonRoot") is True, name
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False and not sc.get("privileged"), name
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
            resources = c.get("resources", {})
            assert resources.get("requests", {}).get("memory"), name
            assert resources.get("limits", {}).get("memory"), name


KUSTOMIZE = (["kubectl", "kustomize"] if shutil.which("kubectl")
             else ["kustomize", "build"] if shutil.which("kustomize") else None)


@pytest.mark.skipif(KUSTOMIZE is None, reason="neither kubectl nor kustomize is installed")
@pytest.mark.parametrize("root", ["k8s", "aerospike", "aerospike-cluster", ".", "k8s-autoscale/keda",
                                  "k8s-autoscale/hpa"])
def test_kustomize_builds(root: str) -> None:
    """Local, no cluster: kustomize accepts the layout (files under each kustomization's directory),
    and every ConfigMap a built pod mounts is in the build, generated names and all."""
    assert KUSTOMIZE is not None
    run = subprocess.run([*KUSTOMIZE, str(DEPLOY / root)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    docs = [d for d in yaml.safe_load_all(run.stdout) if d]
    configmaps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for d in docs:
        if d["kind"] in WORKLOADS:
            for v in d["spec"]["template"]["spec"].get("volumes", []):
                assert "configMap" not in v or v["configMap"]["name"] in configmaps, d["metadata"]["name"]


AUTOSCALE = DEPLOY / "k8s-autoscale"
EXPORTED = set(re.findall(r'"(utxoflow_\w+)"', (ROOT / "workers" / "monitor" / "exposition.py").read_text()))


def test_the_autoscalers_scale_the_workers_on_real_queues_and_metrics() -> None:
    """KEDA's ScaledObject and the plain HPA scale k8s/'s worker Deployment, never below one (it
    leads recovery), on the queues workers take and the series `utxo metrics` exports, with the
    same scale-in (one pod a minute after five calm minutes); KEDA reads the Redis of
    UTXO_BROKER_URL and k8s-monitoring/'s Prometheus; prometheus-adapter's rules serve what the
    HPA asks for."""
    (so,) = [d for d in yaml.safe_load_all((AUTOSCALE / "keda" / "scaledobject.yaml").read_text()) if d]
    (hpa,) = [d for d in yaml.safe_load_all((AUTOSCALE / "hpa" / "hpa.yaml").read_text()) if d]
    rules = yaml.safe_load((AUTOSCALE / "hpa" / "prometheus-adapter-rules.yaml").read_text())
    assert "utxo-worker" in k8s("Deployment")
    assert so["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"] == "utxo-worker"
    assert so["spec"]["minReplicaCount"] == hpa["spec"]["minReplicas"] == 1
    assert so["spec"]["maxReplicaCount"] == hpa["spec"]["maxReplicas"]
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300 and down["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 60}]

    broker = urlsplit(k8s("ConfigMap")["utxoflow"]["data"]["UTXO_BROKER_URL"])
    triggers = so["spec"]["triggers"]
    lists = [t["metadata"] for t in triggers if t["type"] == "redis"]
    assert {m["listName"] for m in lists} == {"txs", "blocks"} and {"txs", "blocks"} <= QUEUES
    for m in lists:
        assert m["address"] == f"{broker.hostname}:{broker.port}", m
        assert m["databaseIndex"] == (broker.path.strip("/") or "0"), m
    (prom,) = [t["metadata"] for t in triggers if t["type"] == "prometheus"]
    services = {d["metadata"]["name"]: d for p in (DEPLOY / "k8s-monitoring").glob("*.yaml")
                for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == "Service"}
    server = urlsplit(prom["serverAddress"])
    assert server.port in [p["port"] for p in services[str(server.hostname)]["spec"]["ports"]], prom
    assert set(re.findall(r"utxoflow_\w+", prom["query"])) <= EXPORTED, prom

    asked = [m["external"]["metric"] for m in hpa["spec"]["metrics"] if m["type"] == "External"]
    assert {a["name"] for a in asked} <= EXPORTED
    queues = {a["selector"]["matchLabels"]["queue"] for a in asked if "selector" in a}
    assert queues == {"txs", "blocks"}
    served = {r["name"]["as"] for r in rules["rules"]["external"]}
    assert {r["seriesQuery"] for r in rules["rules"]["external"]} <= EXPORTED
    assert {a["name"] for a in asked} <= served
    # the thresholds agree: one worker per eight txs messages, per 20 blocks messages, per 10 lag
    by_list = {m["listName"]: m["listLength"] for m in lists}
    targets = {a.get("selector", {}).get("matchLabels", {}).get("queue", a["name"]): m["external"]["target"]
               ["averageValue"] for a, m in zip(asked, hpa["spec"]["metrics"])}
    assert targets == {**by_list, "utxoflow_chain_lag_blocks": prom["threshold"]}


COMPOSE_V1 = shutil.which("docker-compose")


@pytest.mark.skipif(COMPOSE_V1 is None, reason="docker-compose is not installed (.ci/run installs it)")
@pytest.mark.parametrize("override", OVERRIDES, ids=lambda o: o or "compose.yaml")
def test_compose_config_accepts_the_files_and_every_bind_mount_exists(
    tmp_path: Path, override: str | None
) -> None:
    """`docker-compose config` (Debian's 1.29: the Compose specification but for the top-level
    `name`, a later key, taken out of a copy here) accepts compose.yaml with each override, and
    every file a service mounts exists where Compose resolves it: from the first file's
    directory, for an override's paths too."""
    assert COMPOSE_V1 is not None
    base = tmp_path / "deploy"
    shutil.copytree(DEPLOY, base, ignore=shutil.ignore_patterns("flower.env"))
    (base / "flower.env").write_text((DEPLOY / "flower.env.example").read_text())
    text = (base / "compose.yaml").read_text()
    assert re.search(r"^name: utxoflow$", text, flags=re.M)
    (base / "compose.yaml").write_text(re.sub(r"^name: utxoflow$", "", text, flags=re.M))
    files = ["-f", str(base / "compose.yaml")] + (["-f", str(base / override)] if override else [])
    run = subprocess.run([COMPOSE_V1, *files, "config"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    services = yaml.safe_load(run.stdout)["services"]
    for name, svc in services.items():
        for v in svc.get("volumes", []):
            source = v["source"] if isinstance(v, dict) else v.split(":")[0]
            if source.startswith("/"):
                assert Path(source).exists(), (name, source)
