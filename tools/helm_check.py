"""Check the Helm chart and the image definition without a cluster.

    python -m tools.helm_check --helm .local/bin/helm --checkov PATH --hadolint PATH

For the default values and every values file in helm/statefleet/ci/:
  1. ``helm lint --strict``;
  2. ``helm template`` into .local/helm-check/rendered/<scenario>.yaml;
  3. every rendered object validated against the Kubernetes JSON schemas of
     --kube-version (kubernetes-validate, strict: unknown fields are errors;
     custom resources it has no schema for are reported and skipped);
then checkov lints all rendered manifests (settings in helm/checkov.yaml) and
hadolint lints the Dockerfile (helm/image/hadolint.yaml). ``make helm-check``
runs this, then the pytest suite in tests/helm. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "statefleet"
OUT = REPO / ".local" / "helm-check"
RELEASE = "statefleet"
NAMESPACE = "streaming"


@dataclass(frozen=True)
class Scenario:
    name: str
    values_file: Path | None

    def values_args(self) -> list[str]:
        return ["--values", str(self.values_file)] if self.values_file else []


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.failures.append(message)
        print(f"  FAIL {message}", flush=True)


def scenarios(chart: Path) -> list[Scenario]:
    found = [Scenario("default", None)]
    found += [
        Scenario(p.name.removesuffix("-values.yaml").removesuffix(".yaml"), p) for p in sorted((chart / "ci").glob("*.yaml"))
    ]
    return found


def tool_env() -> dict[str, str]:
    """The environment of the linters: their own virtualenv, without the project's PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(cmd: list[str], report: Report, what: str) -> subprocess.CompletedProcess[str] | None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False, env=tool_env())
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        report.fail(f"{what}: exit {proc.returncode}\n{output}")
        return None
    return proc


def render(helm: str, kube_version: str, scenario: Scenario, chart: Path = CHART) -> str:
    """The manifests of one scenario, as helm template prints them (raises on error)."""
    cmd = [
        helm,
        "template",
        RELEASE,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        kube_version,
        *scenario.values_args(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def documents(text: str) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and doc:
            yield doc


def validate_objects(text: str, kube_version: str, scenario: str, report: Report) -> int:
    count = 0
    for doc in documents(text):
        kind = doc.get("kind", "?")
        name = doc.get("metadata", {}).get("name", "?")
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
            count += 1
        except kubernetes_validate.SchemaNotFoundError:
            report.notes.append(
                f"{scenario}: {kind}/{name} ({doc.get('apiVersion')}) is a custom resource; no schema to validate it against"
            )
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            report.fail(
                f"{scenario}: {kind}/{name} does not match the Kubernetes {kube_version} schema "
                f"at {path or '(top)'}: {exc.message}"
            )
    return count


def lint_manifests(checkov: str, rendered_dir: Path, report: Report) -> None:
    # Files by name: checkov skips directories whose path has a hidden folder (.local) in it.
    files = [arg for path in sorted(rendered_dir.glob("*.yaml")) for arg in ("--file", str(path))]
    cmd = [checkov, "--config-file", str(REPO / "helm" / "checkov.yaml"), *files, "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False, env=tool_env())
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report.fail(f"checkov: exit {proc.returncode}, no JSON report\n{proc.stderr.strip()[-2000:]}")
        return
    results = result if isinstance(result, list) else [result]
    for part in results:
        summary = part.get("summary", {})
        for failed in part.get("results", {}).get("failed_checks", []):
            report.fail(
                f"checkov {failed.get('check_id')} {failed.get('check_name')!r}: "
                f"{failed.get('resource')} in {Path(failed.get('file_path', '?')).name}"
            )
        if summary.get("parsing_errors"):
            report.fail(f"checkov could not parse {summary['parsing_errors']} rendered file(s)")
        if not summary.get("resource_count"):
            report.fail("checkov found no Kubernetes objects to check")
        elif not summary.get("failed"):
            print(
                f"  ok   {summary.get('resource_count')} objects: {summary.get('passed')} checks passed, "
                f"{summary.get('skipped')} skipped by annotation (checkov {summary.get('checkov_version')})"
            )


def step(report: Report, title: str) -> float:
    print(f"== {title}", flush=True)
    return time.monotonic()


def done(report: Report, title: str, started: float) -> None:
    report.timings.append((title, time.monotonic() - started))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--helm", required=True)
    parser.add_argument("--kube-version", required=True, help="Kubernetes version to render and validate for")
    parser.add_argument("--checkov", required=True)
    parser.add_argument("--hadolint", required=True)
    args = parser.parse_args(argv)
    report = Report()
    rendered_dir = OUT / "rendered"
    rendered_dir.mkdir(parents=True, exist_ok=True)
    for old in rendered_dir.glob("*.yaml"):
        old.unlink()
    all_scenarios = scenarios(CHART)

    t = step(report, f"helm lint --strict ({len(all_scenarios)} values sets)")
    for sc in all_scenarios:
        if run(
            [args.helm, "lint", "--strict", str(CHART), "--kube-version", args.kube_version, *sc.values_args()],
            report,
            f"helm lint [{sc.name}]",
        ):
            print(f"  ok   {sc.name}")
    done(report, "helm lint", t)

    t = step(report, f"helm template + Kubernetes {args.kube_version} schemas")
    for sc in all_scenarios:
        try:
            text = render(args.helm, args.kube_version, sc)
        except subprocess.CalledProcessError as exc:
            report.fail(f"helm template [{sc.name}]: {exc.stderr.strip()}")
            continue
        (rendered_dir / f"{sc.name}.yaml").write_text(text)
        valid = validate_objects(text, args.kube_version, sc.name, report)
        print(f"  ok   {sc.name}: {valid} objects valid")
    done(report, "render + validate", t)

    t = step(report, "checkov (Kubernetes checks) on the rendered manifests")
    lint_manifests(args.checkov, rendered_dir, report)
    done(report, "checkov", t)

    t = step(report, "hadolint Dockerfile")
    if run(
        [args.hadolint, "--config", str(REPO / "helm" / "image" / "hadolint.yaml"), str(REPO / "Dockerfile")], report, "hadolint"
    ):
        print("  ok   Dockerfile")
    done(report, "hadolint", t)

    for note in report.notes:
        print(f"  note {note}")
    print("== timings: " + ", ".join(f"{title} {secs:.1f}s" for title, secs in report.timings))
    if report.failures:
        print(f"helm-check: {len(report.failures)} failure(s)", file=sys.stderr)
        return 1
    print("helm-check: chart, manifests and Dockerfile pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
