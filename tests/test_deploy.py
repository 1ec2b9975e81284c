"""The deployment examples in deploy/ use only real settings and real `utxo` commands, and keep
the properties deploy/README.md promises (workers scale, one beat, Flower behind basic auth,
Prometheus scrapes what serves metrics, Grafana's dashboard finds its datasource, nothing but
Flower and Grafana published, on loopback). Plain parsing: no Docker, no cluster."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

import celeryconfig
from stores.utxo.aerospike.client import parse_url
from workers.cli import cli
from workers.settings import Settings, env_name, load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SETTINGS = {env_name(f) for f in Settings.model_fields}
QUEUES = {q.name for q in celeryconfig.task_queues}
SHELL_OPS = {"|", "||", "&&", ";", "&"}

COMPOSE: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
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
    assert "./aerospike.conf:/etc/aerospike/aerospike.conf:ro" in server["volumes"]
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
    override = yaml.safe_load((DEPLOY / "aerospike" / "compose.yaml").read_text())["services"]
    for here, services in ((DEPLOY, SERVICES), (DEPLOY / "aerospike", override)):
        for name, svc in services.items():
            for target, source in bind_mounts(svc).items():
                # Docker makes a directory for a missing source and mounts that, silently.
                assert (here / source).exists(), f"{name}: {source} (for {target}) is missing"


def test_grafana_loads_the_dashboard_with_its_datasource() -> None:
    assert DASHBOARD.is_file(), f"{DASHBOARD} is missing: compose mounts it into Grafana"
    dashboard = json.loads(DASHBOARD.read_text())

    def datasources(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            if "datasource" in node:
                yield node["datasource"]
            for v in node.values():
                yield from datasources(v)
        elif isinstance(node, list):
            for v in node:
                yield from datasources(v)

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
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    sources = {tuple(r.get("source_labels", [])) for r in job["relabel_configs"]}
    for a in SCRAPE_ANNOTATIONS:
        label = "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-z0-9]", "_", a)
        assert any(label in s for s in sources), f"{a} is not honoured"
