"""Render the chart with the helm binary that ``make helm-check`` builds, and pick objects out.

helm comes from STATEFLEET_HELM (set by ``make helm-check``), .local/bin/helm (its link to the
binary it caches per machine), or PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "statefleet"
CI = CHART / "ci"
RELEASE = "sf"
NAMESPACE = "streaming"
KUBE_VERSION = os.environ.get("STATEFLEET_KUBE_VERSION", "1.37.0")
SCENARIOS = ["default", *sorted(p.name.removesuffix("-values.yaml") for p in CI.glob("*-values.yaml"))]


def helm_binary() -> str:
    candidate = os.environ.get("STATEFLEET_HELM") or str(REPO / ".local" / "bin" / "helm")
    if not Path(candidate).exists():
        found = shutil.which("helm")
        if not found:
            pytest.fail("helm is not installed: run `make helm-check` (it links .local/bin/helm)", pytrace=False)
        return found
    return candidate


class RenderError(Exception):
    """helm refused the values; ``str()`` is helm's message."""


@dataclass
class Manifest:
    docs: list[dict[str, Any]]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for d in self.all(kind):
            if d["metadata"]["name"] == name:
                return d
        names = [d["metadata"]["name"] for d in self.all(kind)]
        raise KeyError(f"no {kind} named {name}; there are {names}")

    def has(self, kind: str, name: str) -> bool:
        return any(d["metadata"]["name"] == name for d in self.all(kind))

    def pod_specs(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(kind/name, pod spec) of every workload, including the Spark executor pod template."""
        for d in self.docs:
            kind, name = d.get("kind"), d.get("metadata", {}).get("name")
            spec = d.get("spec", {})
            if kind in ("StatefulSet", "Deployment", "Job"):
                yield f"{kind}/{name}", spec["template"]["spec"]
            elif kind == "CronJob":
                yield f"{kind}/{name}", spec["jobTemplate"]["spec"]["template"]["spec"]
            elif kind == "ConfigMap" and "executor-pod-template.yaml" in d.get("data", {}):
                pod = yaml.safe_load(d["data"]["executor-pod-template.yaml"])
                yield f"executor template in {name}", pod["spec"]


def spark_commands(m: Manifest) -> list[list[str]]:
    """The command (``[module, *args]``) of every Spark driver the chart renders: the containers
    that run a ``spark_jobs`` module, and a SparkApplication's arguments."""
    commands = [
        list(c["args"])
        for _, pod in m.pod_specs()
        for c in pod.get("containers", [])
        if c.get("args") and str(c["args"][0]).startswith("spark_jobs.")
    ]
    return commands + [list(app["spec"]["arguments"]) for app in m.all("SparkApplication")]


def run_helm(chart: Path, values: list[Path], sets: list[str], api_versions: list[str], kube_version: str = KUBE_VERSION) -> str:
    cmd = [helm_binary(), "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--kube-version", kube_version]
    for v in values:
        cmd += ["--values", str(v)]
    for s in sets:
        cmd += ["--set", s]
    for a in api_versions:
        cmd += ["--api-versions", a]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RenderError(proc.stderr.strip())
    return proc.stdout


def to_manifest(text: str) -> Manifest:
    return Manifest([d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d])


def scenario_values(name: str) -> list[Path]:
    return [] if name == "default" else [CI / f"{name}-values.yaml"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def env_names(container: dict[str, Any]) -> list[str]:
    return [e["name"] for e in container.get("env", [])]
