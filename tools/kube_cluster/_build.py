"""Builds the cluster's binaries from the Go module proxy into a cache outside the clone.

Every binary is built once per version into ``$STATEFLEET_CACHE/kube/<component>-<version>/``
(default ``~/.cache/statefleet``), so a fresh clone on the same machine builds nothing. A
component's folder appears only once its build is complete (built beside it, then renamed).

Kubernetes and etcd cannot be ``go install``ed: their go.mod files replace their staging
modules with local folders, which Go refuses for a module taken from the proxy. A small
wrapper module requires them and replaces each staging module with its published release.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import background

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"
COREDNS_VERSION = "v1.15.0"
CONTAINERD_VERSION = "v2.4.2"
CRICTL_VERSION = "v1.37.0"
#: Prometheus 3.x (its Go module is tagged v0.3xx). Debian's prometheus 2.42 is built without
#: Kubernetes service discovery, which the cluster check scrapes the pods with.
PROMETHEUS_VERSION = "v0.316.0"

#: The plugins the cluster's Corefile uses (``_node._corefile``), in CoreDNS's own order (its
#: plugin.cfg). A CoreDNS of these alone leaves out the cloud providers' SDKs, most of a full
#: build's time.
COREDNS_PLUGINS = ("bind", "errors", "cache", "kubernetes")

KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl")


class BuildError(RuntimeError):
    """A binary could not be built; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("STATEFLEET_CACHE", Path.home() / ".cache" / "statefleet")) / "kube"


def go_binary() -> str:
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists() and shutil.which(go) is None:
        raise BuildError("the cluster's binaries are built with Go 1.26 or newer: install Go (or set GO=/path/to/go)")
    return go


def _log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def _go(args: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    full_env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", **(env or {})}
    result = subprocess.run([go_binary(), *args], cwd=cwd, env=full_env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"go {' '.join(args)} failed in {cwd}:\n{result.stderr[-4000:]}")


@dataclass(frozen=True)
class Component:
    name: str
    version: str

    @property
    def folder(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    @property
    def bin(self) -> Path:
        return self.folder / "bin"


KUBERNETES = Component("kubernetes", KUBERNETES_VERSION)
ETCD = Component("etcd", ETCD_VERSION)
COREDNS = Component("coredns", COREDNS_VERSION)
CONTAINERD = Component("containerd", CONTAINERD_VERSION)
CRICTL = Component("crictl", CRICTL_VERSION)
PAUSE = Component("pause", KUBERNETES_VERSION)
PROMETHEUS = Component("prometheus", PROMETHEUS_VERSION)
COMPONENTS = (KUBERNETES, ETCD, COREDNS, CONTAINERD, CRICTL, PAUSE, PROMETHEUS)


def _staging_replaces(module: str, version: str, work: Path) -> list[tuple[str, str]]:
    """The modules ``module``'s go.mod replaces with folders of its own repository."""
    _go(["mod", "download", f"{module}@{version}"], cwd=work)
    info = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"{module}@{version}"], cwd=work, capture_output=True, text=True, check=True
    ).stdout
    gomod = Path(re.search(r'"GoMod": "([^"]+)"', info).group(1))  # type: ignore[union-attr]
    return re.findall(r"^\s*(\S+)\s+=>\s+\./\S+\s*$", gomod.read_text(), flags=re.MULTILINE)  # type: ignore[return-value]


def _wrapper(work: Path, module: str, version: str, staging_version: str) -> None:
    """A module that requires ``module`` and replaces its staging modules by their releases."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(f"module statefleet.local/wrapper\n\ngo 1.26\n\nrequire {module} {version}\n")
    replaces = _staging_replaces(module, version, work)
    lines = [f"\t{name} => {name} {staging_version}" for name in replaces]
    (work / "go.mod").write_text(
        f"module statefleet.local/wrapper\n\ngo 1.26\n\nrequire {module} {version}\n\nreplace (\n" + "\n".join(lines) + "\n)\n"
    )
    (work / "tools.go").write_text(f'//go:build tools\n\npackage wrapper\n\nimport _ "{module}"\n')


def _build_kubernetes(out: Path, work: Path) -> None:
    _wrapper(work, "k8s.io/kubernetes", KUBERNETES_VERSION, "v0" + KUBERNETES_VERSION[2:])
    ldflags = f"-s -w -X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}"
    _go(["mod", "download"], cwd=work)
    for binary in KUBE_BINARIES:
        _log(f"building {binary} {KUBERNETES_VERSION} (the first build of all six takes about 7 min on 2 cores)")
        _go(
            ["build", "-p", "2", "-trimpath", "-ldflags", ldflags, "-o", str(out / binary), f"k8s.io/kubernetes/cmd/{binary}"],
            cwd=work,
        )


def _build_etcd(out: Path, work: Path) -> None:
    _wrapper(work, "go.etcd.io/etcd/server/v3", ETCD_VERSION, ETCD_VERSION)
    _go(["mod", "download"], cwd=work)
    _go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"], cwd=work)


def _build_coredns(out: Path, work: Path) -> None:
    """CoreDNS with only ``COREDNS_PLUGINS``: a main package of its own that imports them and
    sets the server's directives, the way CoreDNS documents builds with external plugins."""
    work.mkdir(parents=True, exist_ok=True)
    requirement = f"require github.com/coredns/coredns {COREDNS_VERSION}"
    (work / "go.mod").write_text(f"module statefleet.local/coredns\n\ngo 1.26\n\n{requirement}\n")
    imports = "".join(f'\t_ "github.com/coredns/coredns/plugin/{name}"\n' for name in COREDNS_PLUGINS)
    directives = ", ".join(f'"{name}"' for name in COREDNS_PLUGINS)
    (work / "main.go").write_text(
        "package main\n\nimport (\n"
        '\t"github.com/coredns/coredns/core/dnsserver"\n'
        '\t"github.com/coredns/coredns/coremain"\n'
        f"{imports})\n\n"
        f"func init() {{\n\tdnsserver.Directives = []string{{{directives}}}\n}}\n\n"
        "func main() {\n\tcoremain.Run()\n}\n"
    )
    _go(["mod", "tidy"], cwd=work)
    _go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "coredns"), "."], cwd=work)


def _go_install(out: Path, work: Path, packages: Sequence[str], version: str, cgo: bool = True, tags: str = "") -> None:
    work.mkdir(parents=True, exist_ok=True)
    env = {"GOBIN": str(out), **({} if cgo else {"CGO_ENABLED": "0"})}
    flags = ["-tags", tags] if tags else []
    for package in packages:
        _go(["install", "-trimpath", "-ldflags", "-s -w", *flags, f"{package}@{version}"], cwd=work, env=env)


def _build_pause(out: Path, work: Path) -> None:
    """The pod sandbox's pause binary, from the kubernetes module's own source."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("the pause image is compiled from C: install gcc (apt-get install gcc libc6-dev)")
    work.mkdir(parents=True, exist_ok=True)
    _go(["mod", "download", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"], cwd=work)
    info = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    source = Path(re.search(r'"Dir": "([^"]+)"', info).group(1)) / "build" / "pause" / "linux" / "pause.c"  # type: ignore[union-attr]
    version = f'-DVERSION="{KUBERNETES_VERSION}"'
    subprocess.run([gcc, "-Os", "-static", "-Wall", "-Werror", version, "-o", str(out / "pause"), str(source)], check=True)


def _build(component: Component) -> None:
    builders: dict[str, Callable[[Path, Path], None]] = {
        "kubernetes": _build_kubernetes,
        "etcd": _build_etcd,
        "coredns": _build_coredns,
        "containerd": lambda out, work: _go_install(
            out,
            work,
            [
                "github.com/containerd/containerd/v2/cmd/containerd",
                "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                "github.com/containerd/containerd/v2/cmd/ctr",
            ],
            CONTAINERD_VERSION,
            cgo=False,
        ),
        "crictl": lambda out, work: _go_install(out, work, ["sigs.k8s.io/cri-tools/cmd/crictl"], CRICTL_VERSION),
        "pause": _build_pause,
        # Only the Kubernetes service discovery: the other clouds' SDKs would double the build.
        "prometheus": lambda out, work: _go_install(
            out,
            work,
            ["github.com/prometheus/prometheus/cmd/prometheus"],
            PROMETHEUS_VERSION,
            tags="remove_all_sd,enable_kubernetes_sd",
        ),
    }
    partial = component.folder.with_name(component.folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "bin").mkdir(parents=True)
    started = time.monotonic()
    builders[component.name](partial / "bin", partial / "src")
    shutil.rmtree(partial / "src", ignore_errors=True)
    partial.rename(component.folder)
    _log(f"built {component.name} {component.version} in {time.monotonic() - started:.0f}s into {component.folder}")


def missing() -> list[Component]:
    """The components not in the cache yet (none, on a warm machine)."""
    return [c for c in COMPONENTS if not c.bin.is_dir()]


def build_all() -> None:
    """Builds each component that is not in the cache yet (nothing, on a warm machine).

    One build at a time per cache: a second one (``make cluster-up`` while the build that
    ``make test`` started early still runs) waits for the first, then finds its work done."""
    if not missing():
        return
    with background.exclusive(cache_root() / ".build.lock", "build of the cluster's binaries", _log):
        for component in missing():
            _build(component)


def build_in_background(log: Path) -> int | None:
    """Start ``build_all`` at the lowest priority (tools/background.py) when a component is
    missing: it then uses what a test run leaves idle (two cores for about 17 minutes,
    cold). Returns its pid, or None when everything is built."""
    if not missing():
        return None
    return background.start_at_lowest_priority(["tools.kube_cluster", "build"], log)


def binary(name: str) -> Path:
    for component in COMPONENTS:
        path = component.bin / name
        if path.exists():
            return path
    raise BuildError(f"{name} is not built: run `make cluster-up` (it builds the cluster's binaries first)")
