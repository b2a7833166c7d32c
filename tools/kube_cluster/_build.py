"""Builds the cluster's binaries from the Go module proxy into a cache outside the clone.

Every binary is built once per set of versions into ``$STATEFLEET_CACHE/kube/<component>-<version>/``
(default ``~/.cache/statefleet``), so a fresh clone on the same machine builds nothing. A
component's folder appears only once its build is complete (built beside it, then renamed).

Every Go program comes from one module that requires them all, in one ``go build``: they
share most of their dependencies (k8s.io/api and client-go, grpc, protobuf, OpenTelemetry, ...),
and one module picks one version of each, so each package compiles once rather than once per
program (about 15,100 Go files to compile instead of about 26,000).

helm (``make helm-check``, the cluster check) is built from the same module, on its own
(``build_helm``), and first when ``build_all`` builds anything: its Kubernetes libraries
(client-go, apimachinery, kubectl, ...) are the cluster programs', so the programs' build then
finds them compiled.

Kubernetes and etcd cannot be ``go install``ed: their go.mod files replace their staging
modules with local folders, which Go refuses for a module taken from the proxy. The module
replaces each staging module with its published release.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
#: helm.mk reads this line for the path it keeps helm at.
HELM_VERSION = "v3.22.0"
HELM_PROGRAM = "helm.sh/helm/v3/cmd/helm"

#: The plugins the cluster's Corefile uses (``_node._corefile``), in CoreDNS's own order (its
#: plugin.cfg). A CoreDNS of these alone leaves out the cloud providers' SDKs, most of a full
#: build's time.
COREDNS_PLUGINS = ("bind", "errors", "cache", "kubernetes")

KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl")

#: The container runtime, built before the other programs: the image's copy into containerd
#: (``_node.preload_image``) needs only these, and runs while the rest compiles.
RUNTIME_PROGRAMS = {
    name: f"github.com/containerd/containerd/v2/cmd/{name}" for name in ("containerd", "containerd-shim-runc-v2", "ctr")
}
#: The cluster's other programs: binary name → main package. etcd's and CoreDNS's mains are the
#: module's own (``_write_module``): etcd's is its module's root package, which ``go build -o``
#: would name ``server``, and CoreDNS's keeps only ``COREDNS_PLUGINS``.
CLUSTER_PROGRAMS = {
    **{name: f"k8s.io/kubernetes/cmd/{name}" for name in KUBE_BINARIES},
    "etcd": "./etcd",
    "coredns": "./coredns",
    "crictl": "sigs.k8s.io/cri-tools/cmd/crictl",
    "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
}
#: Every Go program of the cluster, all from one module.
GO_PROGRAMS = {**RUNTIME_PROGRAMS, **CLUSTER_PROGRAMS}
#: The modules the build requires, and the release that replaces each of their staging modules.
GO_MODULES = (
    ("k8s.io/kubernetes", KUBERNETES_VERSION, "v0" + KUBERNETES_VERSION[2:]),
    ("go.etcd.io/etcd/server/v3", ETCD_VERSION, ETCD_VERSION),
    ("github.com/coredns/coredns", COREDNS_VERSION, None),
    ("github.com/containerd/containerd/v2", CONTAINERD_VERSION, None),
    ("sigs.k8s.io/cri-tools", CRICTL_VERSION, None),
    ("github.com/prometheus/prometheus", PROMETHEUS_VERSION, None),
    ("helm.sh/helm/v3", HELM_VERSION, None),
)
#: Prometheus with only its Kubernetes discovery: the other clouds' SDKs would double the build.
#: No other module of the build uses these tags.
GO_TAGS = "remove_all_sd,enable_kubernetes_sd"
#: Static binaries with Go's own DNS resolver, as the projects' releases are built.
GO_ENV = {"CGO_ENABLED": "0"}
#: No debugging information: the linker drops it anyway (``-w`` below), so the compiler need not
#: make it (docs/kubernetes.md has what that saves).
GO_GCFLAGS = "all=-dwarf=false"
GO_LDFLAGS = f"-s -w -X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}"
#: As helm's release Makefile sets it (a build from a module other than helm's own would say "v3.22").
HELM_LDFLAGS = f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"


class BuildError(RuntimeError):
    """A binary could not be built; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("STATEFLEET_CACHE", Path.home() / ".cache" / "statefleet")) / "kube"


def build_lock() -> Path:
    """The lock that lets one build at a time use the cache: the cluster's or helm's."""
    return cache_root() / ".build.lock"


def go_binary() -> str:
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists() and shutil.which(go) is None:
        raise BuildError("the cluster's binaries are built with Go 1.26 or newer: install Go (or set GO=/path/to/go)")
    return go


def _log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def _go(args: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Runs ``go args`` and returns its output; a failure raises with what go printed (``-json``
    commands print their error on stdout)."""
    full_env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", **(env or {})}
    result = subprocess.run([go_binary(), *args], cwd=cwd, env=full_env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"go {' '.join(args)} failed in {cwd}:\n{(result.stdout + result.stderr)[-4000:]}")
    return result.stdout


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


def _programs_version() -> str:
    """Names what the Go build makes: its modules' versions, CoreDNS's plugins and the flags."""
    recipe = repr((GO_MODULES, GO_PROGRAMS, COREDNS_PLUGINS, GO_TAGS, GO_ENV, GO_GCFLAGS, GO_LDFLAGS))
    return f"{KUBERNETES_VERSION}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


RUNTIME_BUILD = Component("container-runtime", _programs_version())
GO_PROGRAMS_BUILD = Component("go-programs", _programs_version())
PAUSE = Component("pause", KUBERNETES_VERSION)
#: In the order ``build_all`` builds them: what the image's preload needs comes first.
COMPONENTS = (PAUSE, RUNTIME_BUILD, GO_PROGRAMS_BUILD)
#: What ``_node.preload_image`` needs: containerd, ctr and the pause image's binary.
PRELOAD_COMPONENTS = (PAUSE, RUNTIME_BUILD)
#: How often ``build_for_preload`` looks whether the build in progress has made them.
PRELOAD_POLL_S = 10.0


def _go_mod_info(module: str, version: str, field: str, work: Path) -> Path:
    """A ``go mod download -json`` path field (``Dir``, ``GoMod``) of ``module@version``."""
    return Path(json.loads(_go(["mod", "download", "-json", f"{module}@{version}"], cwd=work))[field])


def _staging_replaces(module: str, version: str, work: Path) -> list[str]:
    """The modules ``module``'s go.mod replaces with folders of its own repository."""
    gomod = _go_mod_info(module, version, "GoMod", work)
    return re.findall(r"^\s*(\S+)\s+=>\s+\./\S+\s*$", gomod.read_text(), flags=re.MULTILINE)


def _write_module(work: Path) -> None:
    """The one module of the Go build: it requires ``GO_MODULES``, replaces their staging
    modules with releases, and holds the mains of etcd and of a CoreDNS of ``COREDNS_PLUGINS``
    (a main package of its own that imports them and sets the server's directives, the way
    CoreDNS documents builds with external plugins)."""
    work.mkdir(parents=True, exist_ok=True)
    header = "module statefleet.local/cluster\n\ngo 1.26\n"
    (work / "go.mod").write_text(header)  # the module the staging lookups below run in
    requires = "".join(f"\t{module} {version}\n" for module, version, _ in GO_MODULES)
    replaces = "".join(
        f"\t{name} => {name} {release}\n"
        for module, version, release in GO_MODULES
        if release is not None
        for name in _staging_replaces(module, version, work)
    )
    (work / "go.mod").write_text(f"{header}\nrequire (\n{requires})\n\nreplace (\n{replaces})\n")
    (work / "etcd").mkdir()
    (work / "etcd" / "main.go").write_text(
        'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
        "func main() {\n\tetcdmain.Main(os.Args)\n}\n"
    )
    imports = "".join(f'\t_ "github.com/coredns/coredns/plugin/{name}"\n' for name in COREDNS_PLUGINS)
    directives = ", ".join(f'"{name}"' for name in COREDNS_PLUGINS)
    (work / "coredns").mkdir()
    (work / "coredns" / "main.go").write_text(
        "package main\n\nimport (\n"
        '\t"github.com/coredns/coredns/core/dnsserver"\n'
        '\t"github.com/coredns/coredns/coremain"\n'
        f"{imports})\n\n"
        f"func init() {{\n\tdnsserver.Directives = []string{{{directives}}}\n}}\n\n"
        "func main() {\n\tcoremain.Run()\n}\n"
    )


def _go_build(out: Path, work: Path, packages: Sequence[str], ldflags: str) -> None:
    """``go build`` of ``packages`` in the module at ``work``, the executables into ``out``. Every
    build of the module passes the same tags, environment and flags, so that the packages one
    compiles are found in the build cache by the next."""
    _go(
        [
            "build",
            "-p",
            "2",
            "-trimpath",
            "-tags",
            GO_TAGS,
            "-gcflags",
            GO_GCFLAGS,
            "-ldflags",
            ldflags,
            "-o",
            f"{out}/",
            *packages,
        ],
        cwd=work,
        env=GO_ENV,
    )


def _build_programs(programs: dict[str, str], about: str, out: Path, work: Path) -> None:
    """``programs`` in one Go build of the whole module: the same module, tags and flags for
    every component, so that each finds the packages another compiled in the build cache."""
    _write_module(work)
    _log(f"building {', '.join(programs)} in one Go build ({about} on 2 cores when nothing is cached)")
    _go_build(out, work, list(programs.values()), GO_LDFLAGS)
    missing_programs = [name for name in programs if not (out / name).is_file()]
    if missing_programs:
        raise BuildError(f"the Go build in {work} made no {', '.join(missing_programs)}")


def _build_runtime(out: Path, work: Path) -> None:
    _build_programs(RUNTIME_PROGRAMS, "about 4 min", out, work)


def _build_cluster_programs(out: Path, work: Path) -> None:
    _build_programs(CLUSTER_PROGRAMS, "about 13 min", out, work)


def helm_binary() -> Path:
    """Where helm ``HELM_VERSION`` is kept in the cache (mk/helm.mk's ``HELM``)."""
    return cache_root() / f"helm-{HELM_VERSION}" / "helm"


def build_helm(dest: Path) -> None:
    """helm ``HELM_VERSION`` into the file ``dest`` (nothing when it is there), from the module of
    the cluster's programs. One build at a time per cache, as ``build_all``: when the cluster's
    build runs (``make test`` starts it early), helm waits for it, and that build makes helm
    first."""
    if dest.is_file():
        return
    with background.exclusive(build_lock(), "build of the cluster's binaries or helm", _log):
        _build_helm(dest)


def _build_helm(dest: Path) -> None:
    """helm into ``dest`` unless it is there; the caller holds :func:`build_lock`."""
    if dest.is_file():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build.", dir=dest.parent))
    try:
        _write_module(work / "src")
        (work / "bin").mkdir()
        _log(f"building helm {HELM_VERSION} into {dest} (about 2.5 min on 2 cores when nothing is cached)")
        started = time.monotonic()
        _go_build(work / "bin", work / "src", [HELM_PROGRAM], HELM_LDFLAGS)
        (work / "bin" / "helm").rename(dest)
        _log(f"built helm {HELM_VERSION} in {time.monotonic() - started:.0f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build_pause(out: Path, work: Path) -> None:
    """The pod sandbox's pause binary, from the kubernetes module's own source."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("the pause image is compiled from C: install gcc (apt-get install gcc libc6-dev)")
    work.mkdir(parents=True, exist_ok=True)
    source = _go_mod_info("k8s.io/kubernetes", KUBERNETES_VERSION, "Dir", work) / "build" / "pause" / "linux" / "pause.c"
    version = f'-DVERSION="{KUBERNETES_VERSION}"'
    subprocess.run([gcc, "-Os", "-static", "-Wall", "-Werror", version, "-o", str(out / "pause"), str(source)], check=True)


def _build(component: Component) -> None:
    builders: dict[str, Callable[[Path, Path], None]] = {
        RUNTIME_BUILD.name: _build_runtime,
        GO_PROGRAMS_BUILD.name: _build_cluster_programs,
        PAUSE.name: _build_pause,
    }
    partial = component.folder.with_name(component.folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "bin").mkdir(parents=True)
    started = time.monotonic()
    builders[component.name](partial / "bin", partial / "src")
    shutil.rmtree(partial / "src", ignore_errors=True)
    partial.rename(component.folder)
    _log(f"built {component.name} {component.version} in {time.monotonic() - started:.0f}s into {component.folder}")


def missing(components: Sequence[Component] | None = None) -> list[Component]:
    """Which of ``components`` (all by default) are not in the cache yet (none, on a warm machine)."""
    return [c for c in (COMPONENTS if components is None else components) if not c.bin.is_dir()]


def to_build() -> list[str]:
    """What :func:`build_all` would build, in its order (nothing, on a warm machine)."""
    return (["helm"] if not helm_binary().is_file() else []) + [c.name for c in missing()]


def build_all() -> None:
    """Builds helm and each component that is not in the cache yet (nothing, on a warm machine).

    helm comes first: ``make test`` runs helm-check long before the cluster check, and on a
    cold machine helm-check otherwise waited for the whole build (503 s of a 2,937 s run),
    with the suites that need none of it queued behind. Then pause and the container runtime,
    which the image's preload needs (``build_for_preload``), then the cluster's other programs.

    One build at a time per cache: a second one (``make cluster-up`` while the build that
    ``make test`` started early still runs) waits for the first, then finds its work done."""
    if not to_build():
        return
    with background.exclusive(build_lock(), "build of the cluster's binaries", _log):
        _build_helm(helm_binary())
        for component in missing():
            _build(component)


def build_for_preload() -> None:
    """Returns once containerd, ctr and pause are built (``PRELOAD_COMPONENTS``), building them
    if no build is under way, without waiting for the rest of a build in progress: that build
    makes them first, and the image's copy into containerd then runs while the other programs
    compile. (In the cold run of ``a63fba3`` the preload waited for the whole build, and the
    cluster check copied the image a second time beside it: 61 s on the run's clock.)"""
    waited_since: float | None = None
    while missing(PRELOAD_COMPONENTS):
        with background.exclusive_if_free(build_lock()) as free:
            if free:
                for component in missing(PRELOAD_COMPONENTS):
                    _build(component)
                break
        if waited_since is None:
            waited_since = time.monotonic()
            _log("a build of the cluster's binaries is running: waiting for it to make containerd and ctr")
        time.sleep(PRELOAD_POLL_S)
    if waited_since is not None:
        _log(f"containerd and ctr are built (waited {time.monotonic() - waited_since:.0f}s)")


def build_in_background(log: Path) -> int | None:
    """Start ``build_all`` at the lowest priority (tools/background.py) when helm or a component
    is missing: it then uses what a test run leaves idle (about 1,800 CPU-seconds, 15 minutes of
    two cores, cold). Returns its pid, or None when everything is built."""
    if not to_build():
        return None
    return background.start_at_lowest_priority(["tools.kube_cluster", "build"], log)


def binary(name: str) -> Path:
    for component in COMPONENTS:
        path = component.bin / name
        if path.exists():
            return path
    raise BuildError(f"{name} is not built: run `make cluster-up` (it builds the cluster's binaries first)")
