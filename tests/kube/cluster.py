"""The kube check's view of the cluster `make cluster-up` started: kubectl and helm on its
kubeconfig, Service addresses, pod readiness, and a reader that counts failed queries
while pods die, restart and roll."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.kube_cluster import _build

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "statefleet"
VALUES = CHART / "ci" / "cluster-values.yaml"
RELEASE = "statefleet"
KUBECONFIG = os.environ.get("KUBECONFIG", str(REPO / ".local" / "kube" / "admin.kubeconfig"))


class CommandFailed(AssertionError):
    pass


def run(argv: list[str], timeout: float = 900, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, input=stdin, env={**os.environ, "KUBECONFIG": KUBECONFIG}
    )
    if check and result.returncode != 0:
        raise CommandFailed(
            f"{' '.join(argv[:6])} ... exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def kubectl(*args: str, timeout: float = 300, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run([str(_build.binary("kubectl")), *args], timeout=timeout, check=check, stdin=stdin)


def apply(namespace: str, *objects: dict[str, Any]) -> None:
    """Create or update ``objects`` in ``namespace``, given on stdin (a Secret's data never on a command line)."""
    kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


def helm(*args: str, timeout: float = 1200, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("STATEFLEET_HELM") or str(REPO / ".local" / "bin" / "helm")
    return run([binary, *args], timeout=timeout, check=check)


def cluster_reachable() -> str | None:
    """None when the cluster answers; otherwise why not (the check cannot run)."""
    if not Path(KUBECONFIG).exists():
        return f"no kubeconfig at {KUBECONFIG}: start the cluster with `make cluster-up`"
    result = kubectl("get", "--raw", "/readyz", check=False, timeout=20)
    return None if result.returncode == 0 else f"the cluster does not answer: {result.stderr.strip()}"


@dataclass
class Namespace:
    name: str

    def service_url(self, component: str) -> str:
        """The client Service's ClusterIP address (kube-proxy routes the node's own traffic too)."""
        svc = kubectl_json("-n", self.name, "get", "service", f"{RELEASE}-{component}")
        return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = kubectl_json("-n", self.name, "get", "pods", "-l", selector)["items"]
        return items

    def pod(self, name: str) -> dict[str, Any] | None:
        result = kubectl("-n", self.name, "get", "pod", name, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def statefulset(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = kubectl_json("-n", self.name, "get", "statefulset", name)
        return out

    def logs(self, pod: str, previous: bool = False) -> str:
        args = ["-n", self.name, "logs", pod, "--tail", "400"] + (["--previous"] if previous else [])
        return kubectl(*args, check=False).stdout


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod.get("metadata", {}).get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount", 0)) for s in pod.get("status", {}).get("containerStatuses", []))


@dataclass
class Reader:
    """Asks for each URL in turn, as fast as answers come (one client, keep-alive off so every
    query goes through the Service's balancing afresh), counting what failed."""

    urls: list[str]
    expected: dict[str, Any] = field(default_factory=dict)
    total: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Reader:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=5, limits=limits) as client:
            while not self._stop.is_set():
                for url in self.urls:
                    self.total += 1
                    try:
                        response = client.get(url)
                        ok = response.status_code == 200
                        reason = f"{response.status_code} {response.text[:160]}"
                    except httpx.HTTPError as error:
                        ok, reason = False, f"{type(error).__name__}: {error}"
                    if not ok:
                        self.failed += 1
                        if len(self.failures) < 20:
                            self.failures.append(f"{time.strftime('%H:%M:%S')} {url}: {reason}")
                    time.sleep(0.02)

    def summary(self) -> str:
        return f"{self.failed} of {self.total} reads failed" + (f"; first: {self.failures[:3]}" if self.failures else "")


RESULTS = REPO / ".local" / "kube-check-results.json"


def record(name: str, **figures: Any) -> None:
    """Keeps a measured figure for docs/kubernetes.md (printed too)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[name] = figures
    RESULTS.write_text(json.dumps(results, indent=1))
    print(f"kube-check {name}: {figures}")
