"""Beyond one server: the Helm chart (linted by Helm's own code, its manifests checked against Kubernetes' schemas
without a cluster), docker-compose.yml's `fleet` profile, and the NGINX balancer template both use, run for real:
two `adaflash serve` replicas behind it on loopback, one killed mid-load (adaflash_tools.failover)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from adaflash_tools import failover
from adaflash_server.launcher import free_ports

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "adaflash"
KUBERNETES = "1.33.0"  # the schemas the manifests are held to (kubernetes-validate ships them)
RELEASE, NAMESPACE = "demo", "prod"
NGINX = shutil.which("nginx")
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not on PATH (Debian: apt-get install nginx; "
                                                       ".ci/run installs it where it can)")


def manifests(values: dict | None = None) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]


def one(docs: list[dict], kind: str, component: str) -> dict:
    [doc] = [d for d in docs
             if d["kind"] == kind and d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return doc


def compose_services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_the_chart_passes_helm_lint_strict() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("values", [None, {"replicaCount": 5, "serveArgs": ["--max-active", "32"],
                                           "metrics": {"podAnnotations": False, "serviceMonitor": {"enabled": True}}}])
def test_every_manifest_follows_the_kubernetes_schema_strictly(values: dict | None) -> None:
    docs = manifests(values)
    for doc in docs:
        if doc["kind"] != "ServiceMonitor":  # the Prometheus Operator's CRD: no Kubernetes schema (checked below)
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "ConfigMap"}


def test_replicas_run_the_image_command_with_probes_on_triton_health_and_are_scraped() -> None:
    docs = manifests({"replicaCount": 3})
    deployment = one(docs, "Deployment", "replica")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["image"] == "adaflash:cpu"
    assert container["command"] == json.loads(DockerfileParser(str(ROOT / "Dockerfile")).cmd)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == ports["metrics"]


def test_the_service_monitor_scrapes_the_metrics_port_when_switched_on() -> None:
    assert not [d for d in manifests() if d["kind"] == "ServiceMonitor"]
    docs = manifests({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}}})
    [monitor] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    headless = one(docs, "Service", "replica")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert "metrics" in [p["name"] for p in headless["spec"]["ports"]]


def test_the_balancer_resolves_every_ready_replica_through_a_headless_service() -> None:
    docs = manifests()
    pod_labels = one(docs, "Deployment", "replica")["spec"]["template"]["metadata"]["labels"]
    headless = one(docs, "Service", "replica")
    assert headless["spec"]["clusterIP"] == "None"
    assert not headless["spec"].get("publishNotReadyAddresses")  # DNS lists ready pods only
    assert headless["spec"]["selector"].items() <= pod_labels.items()
    [container] = one(docs, "Deployment", "balancer")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    name = f"{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local:8001"
    assert env["ADAFLASH_REPLICAS"] == f"server {name} resolve {failover.REPLICA_PARAMS};"
    [template] = one(docs, "ConfigMap", "balancer")["data"].values()
    assert template == failover.TEMPLATE.read_text()
    assert "${" not in failover.render(template, env)
    balancer = one(docs, "Service", "balancer")
    assert [(p["port"], p["targetPort"]) for p in balancer["spec"]["ports"]] == [(8001, "grpc")]


def test_compose_fleet_puts_replicas_behind_the_same_balancer() -> None:
    services = compose_services()
    replica, balancer = services["replica"], services["balancer"]
    assert replica["profiles"] == balancer["profiles"] == ["fleet"]
    assert replica["deploy"]["replicas"] >= 2
    server = services["server"]
    assert (replica["image"], replica["healthcheck"]) == (server["image"], server["healthcheck"])
    assert "ports" not in replica  # reached through the balancer only
    source, target, mode = balancer["volumes"][0].split(":")
    assert (ROOT / source).resolve() == failover.TEMPLATE and mode == "ro"
    assert target.startswith("/etc/nginx/templates/") and target.endswith(".template")
    env = balancer["environment"]
    assert env["ADAFLASH_REPLICAS"] == f"server replica:8001 resolve {failover.REPLICA_PARAMS};"
    assert "${" not in failover.render(failover.TEMPLATE.read_text(), env)
    assert balancer["depends_on"] == {"replica": {"condition": "service_healthy"}}
    assert balancer["ports"] == [f"8201:{env['ADAFLASH_LB_LISTEN']}"]


def test_the_images_nginx_has_resolve_and_the_helm_default_is_the_same() -> None:
    """`server ... resolve` is open-source nginx's since 1.27.3."""
    compose_image = compose_services()["balancer"]["image"]
    with helm.Chart.load(CHART) as chart:
        assert chart.values["balancer"]["image"] == compose_image
        assert chart.values["balancer"]["replicaParams"] == failover.REPLICA_PARAMS
    version = tuple(int(part) for part in compose_image.split(":")[1].split("-")[0].split("."))
    assert version >= (1, 27, 3)


@needs_nginx
def test_nginx_accepts_the_template_rendered_for_loopback(tmp_path: Path) -> None:
    site = tmp_path / "site.conf"
    site.write_text(failover.render(failover.TEMPLATE.read_text(),
                                    failover.balancer_env("127.0.0.1:1", [f"127.0.0.1:{p}" for p in free_ports(2)])))
    (tmp_path / "tmp").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(failover.nginx_conf(tmp_path, site))
    result = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(conf)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@needs_nginx
def test_killing_a_replica_moves_new_requests_to_the_other(tmp_path: Path) -> None:
    """Two replicas behind NGINX; 4 streams for 4 s, the SIGKILL of replica a's process groups, 6 s more. Requests in
    flight on a (or sent to it while it died) may fail and are counted; every other one succeeds, and after the
    kill only b answers. The JSON is printed for a failing run."""
    report = failover.run(tmp_path, failover.Settings())
    result = report.result
    shown = json.dumps(result, indent=1)
    assert result["checks"] == {name: True for name in result["checks"]}, shown
    assert result["per_replica"]["a"]["passed_on_to_another"] > 0, shown  # a was tried after the kill and skipped
    assert result["recovery_s"] < 5, shown
    assert result["requests"] <= failover.Settings().max_requests
