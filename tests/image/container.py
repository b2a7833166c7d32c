"""Run the built image as the Helm chart runs it, with podman: the image's own entrypoint
and user, a read-only root file system, all capabilities dropped, no privilege
escalation, and only /tmp and the data volume writable.

Containers share the host's network, so they reach the test broker on 127.0.0.1 and
answer on the ports the check gives them. Each one is named after the check's topic
prefix, so that concurrent runs never meet, and is removed when the check ends.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.services import wait_for
from tools import image_build, web

IMAGE = os.environ.get("STATEFLEET_IMAGE", image_build.DEFAULT_TAG)
USER = "10001:10001"  # the image's USER and the chart's runAsUser/runAsGroup


def podman_base() -> list[str]:
    """podman with the image store buildah built into (tools/image_build.py), and a runtime
    and cgroup manager that work without systemd: runc, as crun refuses a hybrid cgroup
    v1/v2 host (STATEFLEET_PODMAN_RUNTIME=crun elsewhere)."""
    return [
        "podman",
        *image_build.storage_args(),
        "--runtime",
        os.environ.get("STATEFLEET_PODMAN_RUNTIME", "runc"),
        "--cgroup-manager",
        "cgroupfs",
    ]


def ulimit_args() -> list[str]:
    """podman gives root's containers 1,048,576 open files and processes, more than an
    unprivileged host (a CI container) may grant: keep this process's limits instead."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 65536) // 2
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``podman ARGS``; ``podman run`` gets this process's limits (see ulimit_args)."""
    if args[:1] == ("run",):
        args = ("run", *ulimit_args(), *args[1:])
    done = subprocess.run([*podman_base(), *args], text=True, capture_output=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done


def inspect_image() -> dict[str, Any]:
    out = podman("image", "inspect", IMAGE).stdout
    info: dict[str, Any] = json.loads(out)[0]
    return info


def writable_dir(path: Path) -> Path:
    """A host directory the container's user owns: a PVC or emptyDir with fsGroup 10001."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 10001, 10001)
    path.chmod(0o770)
    return path


@dataclass
class Container:
    """One container of the image, run like a pod of the chart."""

    name: str
    args: list[str]
    env: dict[str, str]
    mounts: dict[str, Path] = field(default_factory=dict)  # container path -> host directory
    port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run_args(self) -> list[str]:
        command = [
            "--name",
            self.name,
            "--network",
            "host",
            "--read-only",
            "--read-only-tmpfs=false",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
        ]
        for target, source in self.mounts.items():
            command += ["--volume", f"{writable_dir(source)}:{target}:rw"]
        for key, value in sorted(self.env.items()):
            command += ["--env", f"{key}={value}"]
        return [*command, IMAGE, *self.args]

    def start(self) -> Container:
        podman("rm", "--force", "--ignore", self.name, check=False)
        done = podman("run", "--detach", *self.run_args(), timeout=180, check=False)
        assert done.returncode == 0, f"podman run {self.name} failed: {done.stderr}"
        return self

    def run_to_end(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run in the foreground until the command exits; the container is removed after."""
        podman("rm", "--force", "--ignore", self.name, check=False)
        try:
            return podman("run", "--rm", *self.run_args(), timeout=timeout, check=False)
        finally:
            podman("rm", "--force", "--ignore", self.name, check=False)

    def running(self) -> bool:
        out = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False).stdout.strip()
        return out == "true"

    def logs(self, chars: int = 6000) -> str:
        done = podman("logs", self.name, check=False)
        return (done.stdout + done.stderr)[-chars:]

    def exec_python(self, code: str) -> str:
        """Python run inside the running container, as its user."""
        done = podman("exec", self.name, "python", "-c", code, check=False)
        assert done.returncode == 0, f"exec in {self.name} failed: {done.stderr}"
        return done.stdout

    def wait_ready(self, timeout: float = 180) -> Container:
        def ready() -> bool:
            if not self.running():
                raise AssertionError(f"{self.name} exited; its log:\n{self.logs()}")
            try:
                return web.get(self.url + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(ready, timeout=timeout, interval=0.5, message=f"{self.name} ready on {self.url}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; its log:\n{self.logs()}") from None
        return self

    def remove(self) -> None:
        podman("rm", "--force", "--time", "10", "--ignore", self.name, check=False)
