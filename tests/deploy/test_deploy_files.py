"""The deployment files, checked without a container engine or a cluster (this machine has neither):
the compose file against the Compose Specification's JSON schema, the Kubernetes manifests against
Kubernetes' own schemas (kubernetes-validate), and all of them against the server itself: every
file they reference exists, every SMON_ variable is a setting, every port and probe path is one the
server serves."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from smon_server.api.main import create_app
from smon_server.context import ServerContext
from smon_server.settings import Settings
from tests.install import recipe

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"
# tests/deploy/compose-spec.json: schema/compose-spec.json of github.com/compose-spec/compose-spec
# (Apache-2.0), kept here so the test needs no network.
COMPOSE_SCHEMA = Path(__file__).with_name("compose-spec.json")
SETTINGS = Settings(database_url="sqlite:///:memory:")


def setting_names() -> set[str]:
    return {f"SMON_{name.upper()}" for name in Settings.model_fields}


def served_paths() -> set[str]:
    app = create_app(ServerContext.from_settings(SETTINGS))
    return set(app.openapi()["paths"])


# -- docker compose -------------------------------------------------------------------------------
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "docker-compose.yml").read_text()))


def test_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft7Validator(schema).validate(compose())


def test_compose_services_line_up_with_the_server_and_each_other() -> None:
    services = compose()["services"]
    smon = services["smon"]
    assert (REPO / smon["build"] / "Dockerfile").is_file()
    env = smon["environment"]
    assert set(env) <= setting_names(), set(env) - setting_names()
    assert "@postgres:5432/" in env["SMON_DATABASE_URL"]
    assert Settings(database_url=env["SMON_DATABASE_URL"]).database_url.startswith("postgresql+psycopg://")
    published = {int(p.split(":")[1]) for p in smon["ports"]}
    assert published == {SETTINGS.http_port, SETTINGS.grpc_port}
    # The server starts only once PostgreSQL answers its health check.
    assert smon["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    # Every bind mount exists in the repository; Prometheus scrapes the smon service's HTTP port.
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), volume
    scrape = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = [t for job in scrape["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"smon:{SETTINGS.http_port}"]
    for rule_file in scrape["rule_files"]:
        assert (REPO / "deploy/prometheus" / rule_file).is_file()
    datasource = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/smon.yml").read_text())
    assert datasource["datasources"][0]["url"].startswith("http://prometheus:9090")


def test_dockerfile_ships_the_package_as_a_non_root_server() -> None:
    text = (REPO / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.M):
        for path in source.split():
            assert (REPO / path).exists(), path
    # tests/install builds, installs and runs the wheel by this recipe (read from this file).
    image = recipe.read(REPO / "Dockerfile")
    # The build stage copies what the wheel is made of: the build configuration, the readme its
    # metadata includes, and every folder pyproject maps to a package.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "setup.py", pyproject["project"]["readme"]}
    needed |= set(pyproject["tool"]["setuptools"]["package-dir"].values())
    missing = {n for n in needed if not any(Path(n).is_relative_to(s) for s in image.sources)}
    assert not missing, missing
    # ... and the dashboard built (the package's dist/, which git does not hold).
    assert image.built == (("web", "server/smon_server/dashboard/dist"),)
    assert image.extra == "server"  # FastAPI, SQLAlchemy, psycopg, ...
    assert image.entrypoint == ("smon", "server")
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", text, flags=re.M) for p in line.split()}
    assert exposed == {SETTINGS.http_port, SETTINGS.grpc_port}
    user = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert user and user[-1] not in ("root", "0")


# -- Kubernetes -------------------------------------------------------------------------------------
def documents(folder: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        path = folder / resource
        assert path.exists(), path
        if path.is_file():
            out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return documents(K8S / "base")


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_every_manifest_validates_against_the_kubernetes_schema(base: list[dict[str, Any]]) -> None:
    assert {d["kind"] for d in base} == {"Deployment", "Service", "Job", "PodDisruptionBudget"}
    for doc in base:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_rejects_what_the_schema_forbids() -> None:
    # The validator is live: a wrong type in a manifest is an error, not silently accepted.
    broken = yaml.safe_load((K8S / "base/pdb.yaml").read_text())
    broken["spec"]["minAvailable"] = {"not": "a number"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_deployment_is_what_a_platform_team_expects(base: list[dict[str, Any]]) -> None:
    [deployment] = by_kind(base, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": SETTINGS.http_port, "grpc": SETTINGS.grpc_port}
    paths = served_paths()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz" in paths
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" in paths
    env = {e["name"]: e for e in container["env"]}
    assert set(env) <= setting_names(), set(env) - setting_names()
    assert env["SMON_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "smon"
    assert env["SMON_AUTO_MIGRATE"]["value"] == "false"
    assert {"requests", "limits"} <= set(container["resources"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(SETTINGS.http_port)
    assert annotations["prometheus.io/path"] in paths
    # Services select the pods and point at named container ports; the PDB selects them too.
    labels = spec["template"]["metadata"]["labels"]
    for service in by_kind(base, "Service"):
        assert service["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    [pdb] = by_kind(base, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The migration Job runs the CLI's upgrade against the same database.
    [job] = by_kind(base, "Job")
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    assert migrate["command"] == ["smon", "db", "upgrade"]
    assert migrate["env"][0]["valueFrom"] == env["SMON_DATABASE_URL"]["valueFrom"]


def test_the_overlay_refers_to_what_the_base_defines(base: list[dict[str, Any]]) -> None:
    overlay = yaml.safe_load((K8S / "overlays/production/kustomization.yaml").read_text())
    assert overlay["resources"] == ["../../base"]
    images = {c["image"] for d in base for c in _containers(d)}
    assert {i["name"] for i in overlay["images"]} <= {i.split(":")[0] for i in images}
    names = {d["metadata"]["name"] for d in by_kind(base, "Deployment")}
    assert {r["name"] for r in overlay["replicas"]} <= names
    assert all(r["count"] >= 2 for r in overlay["replicas"])


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    template = doc.get("spec", {}).get("template", {})
    return list(template.get("spec", {}).get("containers", []))
