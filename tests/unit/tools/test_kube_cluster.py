"""The cluster's configuration files, without a cluster: what keeps it on this machine and
what these machines need (docs/kubernetes.md#a-cluster-on-this-machine)."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from tools.kube_cluster import _build, _network, _node

REPO = Path(__file__).resolve().parents[3]
BENCHMARK_RANGE = ipaddress.ip_network("198.18.0.0/15")


def test_pod_and_service_ranges_are_in_the_benchmark_range() -> None:
    for cidr in (_network.POD_SUBNET, _network.CLUSTER_CIDR, _network.SERVICE_CIDR):
        assert ipaddress.ip_network(cidr).subnet_of(BENCHMARK_RANGE), cidr  # type: ignore[arg-type]
    assert ipaddress.ip_address(_network.NODE_IP) in ipaddress.ip_network(_network.POD_SUBNET)
    assert ipaddress.ip_address(_network.API_SERVICE_IP) in ipaddress.ip_network(_network.SERVICE_CIDR)


def test_pods_are_never_masqueraded_and_dns_has_no_upstream(tmp_path: Path) -> None:
    home = _node.Home(tmp_path)
    _node._containerd_config(home)
    conflist = json.loads((tmp_path / "cni" / "net.d" / "10-statefleet.conflist").read_text())
    (bridge,) = conflist["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == _network.BRIDGE and bridge["ipMasq"] is False
    corefile = _node._corefile(home).read_text()
    assert "forward" not in corefile and f"bind {_network.NODE_IP}" in corefile


def test_settings_these_machines_need(tmp_path: Path) -> None:
    home = _node.Home(tmp_path)
    containerd = _node._containerd_config(home).read_text()
    assert "restrict_oom_score_adj = true" in containerd and "SystemdCgroup = false" in containerd
    assert _node.PAUSE_IMAGE in containerd
    kubelet = json.loads(_node._kubelet_config(home).read_text())
    assert kubelet["cgroupDriver"] == "cgroupfs" and kubelet["failCgroupV1"] is False
    assert kubelet["clusterDNS"] == [_network.NODE_IP]
    proxy = json.loads(_node._kube_proxy_config(home).read_text())
    # NodePorts on the bridge address only: kube-proxy then leaves route_localnet alone.
    assert proxy["mode"] == "iptables" and proxy["nodePortAddresses"] == [f"{_network.NODE_IP}/32"]


def fake_components() -> list[_build.Component]:
    return [_build.Component(name, "v1") for name in ("a", "b")]


def fake_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Components "a" and "b" and helm, each "built" by making its folder or file; returns the
    names in the order they are built."""
    built: list[str] = []

    def build(component: _build.Component) -> None:
        component.bin.mkdir(parents=True)
        built.append(component.name)

    def build_helm(dest: Path) -> None:
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text("")
            built.append("helm")

    monkeypatch.setattr(_build, "_build", build)
    monkeypatch.setattr(_build, "_build_helm", build_helm)
    monkeypatch.setattr(_build, "COMPONENTS", fake_components())
    return built


def test_a_second_build_waits_for_the_first_and_finds_its_work_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEFLEET_CACHE", str(tmp_path))
    built = fake_builds(monkeypatch)
    (tmp_path / "kube").mkdir()
    with open(tmp_path / "kube" / ".build.lock", "a+") as first:  # the build `make test` started
        fcntl.flock(first, fcntl.LOCK_EX)
        second = threading.Thread(target=_build.build_all)
        second.start()
        second.join(0.5)
        assert second.is_alive() and built == []  # waiting, not building beside it
        # The first build finishes helm and one component.
        _build.helm_binary().parent.mkdir(parents=True)
        _build.helm_binary().write_text("")
        for component in _build.COMPONENTS[:1]:
            component.bin.mkdir(parents=True)
        fcntl.flock(first, fcntl.LOCK_UN)
    second.join(10)
    assert not second.is_alive()
    assert built == ["b"]  # only what was still missing


def test_helm_is_built_first_since_helm_check_comes_long_before_the_cluster_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEFLEET_CACHE", str(tmp_path))
    built = fake_builds(monkeypatch)
    assert _build.to_build() == ["helm", "a", "b"]
    _build.build_all()
    assert built == ["helm", "a", "b"]
    assert _build.to_build() == []
    _build.build_all()  # all there: nothing built again
    assert built == ["helm", "a", "b"]


def test_nothing_starts_in_the_background_when_every_binary_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEFLEET_CACHE", str(tmp_path))
    monkeypatch.setattr(_build, "COMPONENTS", fake_components())
    for component in _build.COMPONENTS:
        component.bin.mkdir(parents=True)
    _build.helm_binary().parent.mkdir(parents=True)
    _build.helm_binary().write_text("")
    assert _build.build_in_background(tmp_path / "build.log") is None
    assert not (tmp_path / "build.log").exists()


def fake_preload_components(monkeypatch: pytest.MonkeyPatch) -> list[_build.Component]:
    """Components "runtime" and "programs", the first of them all that a preload needs."""
    components = [_build.Component(name, "v1") for name in ("runtime", "programs")]
    monkeypatch.setattr(_build, "COMPONENTS", components)
    monkeypatch.setattr(_build, "PRELOAD_COMPONENTS", components[:1])
    monkeypatch.setattr(_build, "PRELOAD_POLL_S", 0.05)
    return components


def test_a_preload_waits_for_the_runtime_only_not_for_the_rest_of_a_build_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEFLEET_CACHE", str(tmp_path))
    built = fake_builds(monkeypatch)
    runtime, programs = fake_preload_components(monkeypatch)
    (tmp_path / "kube").mkdir()
    with open(tmp_path / "kube" / ".build.lock", "a+") as build_in_progress:
        fcntl.flock(build_in_progress, fcntl.LOCK_EX)
        preload = threading.Thread(target=_build.build_for_preload)
        preload.start()
        preload.join(0.3)
        assert preload.is_alive()  # the runtime is not built yet
        runtime.bin.mkdir(parents=True)  # the build in progress makes it; the rest still compiles
        preload.join(5)
        assert not preload.is_alive()
        assert built == [] and not programs.bin.exists()


def test_a_preload_with_no_build_under_way_builds_the_runtime_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEFLEET_CACHE", str(tmp_path))
    built = fake_builds(monkeypatch)
    fake_preload_components(monkeypatch)
    _build.build_for_preload()
    assert built == ["runtime"]
    _build.build_for_preload()  # there: nothing built again
    assert built == ["runtime"]


def test_the_preloads_components_are_built_first() -> None:
    assert _build.COMPONENTS[: len(_build.PRELOAD_COMPONENTS)] == _build.PRELOAD_COMPONENTS
    assert {"containerd", "containerd-shim-runc-v2", "ctr"} <= set(_build.RUNTIME_PROGRAMS)
    assert not set(_build.RUNTIME_PROGRAMS) & set(_build.CLUSTER_PROGRAMS)


def test_a_check_loading_the_image_waits_for_a_preload_copying_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _node.Home(tmp_path)
    loads: list[str] = []
    monkeypatch.setattr(_node, "_load_image", lambda home, image, tag: loads.append(image))
    with open(tmp_path / "containerd.lock", "a+") as preload_copying:
        fcntl.flock(preload_copying, fcntl.LOCK_EX)
        check = threading.Thread(target=_node.load_image, args=(home, "sha256:abc", "statefleet:0.1.0"))
        check.start()
        check.join(0.3)
        assert check.is_alive() and loads == []
        fcntl.flock(preload_copying, fcntl.LOCK_UN)
    check.join(5)
    assert not check.is_alive() and loads == ["sha256:abc"]


@pytest.mark.parametrize("running_before", [False, True])
def test_a_preload_waits_for_binaries_and_image_and_stops_only_the_containerd_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running_before: bool
) -> None:
    home = _node.Home(tmp_path)
    steps: list[str] = []
    containerd_pid: list[int] = [4242] if running_before else []
    monkeypatch.setattr(_node, "require_root", lambda: None)
    monkeypatch.setattr(_build, "build_for_preload", lambda: steps.append("binaries"))
    monkeypatch.setattr(_node, "_pid", lambda home, name: containerd_pid[0] if containerd_pid else None)
    monkeypatch.setattr(_node, "_start_containerd", lambda home, lowest_priority: steps.append(f"start low={lowest_priority}"))
    monkeypatch.setattr(_node, "_ensure_pause_image", lambda home: steps.append("pause"))
    monkeypatch.setattr(_node, "_load_image", lambda home, image, tag: steps.append(f"load {image} as {tag}"))
    monkeypatch.setattr(_node, "_stop", lambda home, name: steps.append(f"stop {name}"))

    def build_image() -> str:
        steps.append("image")
        return "sha256:abc"

    _node.preload_image(home, build_image, "statefleet:0.1.0")
    loaded = ["binaries", "image", "start low=True", "pause", "load sha256:abc as statefleet:0.1.0"]
    assert steps == (loaded if running_before else [*loaded, "stop containerd"])
    # The lock `up` takes before it starts containerd is free again.
    with open(tmp_path / "containerd.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_coredns_is_built_with_every_plugin_the_corefile_uses(tmp_path: Path) -> None:
    depth, used = 0, []
    for line in _node._corefile(_node.Home(tmp_path)).read_text().splitlines():
        words = line.split()
        if depth == 1 and words and words[0] != "}":
            used.append(words[0])
        depth += line.count("{") - line.count("}")
    assert used and set(used) <= set(_build.COREDNS_PLUGINS), used


def test_every_binary_the_node_starts_is_built() -> None:
    source = Path(_node.__file__).read_text()
    started = set(re.findall(r'_build\.binary\("([^"]+)"\)', source))
    assert {"etcd", "kube-apiserver", "kubelet", "containerd", "coredns", "pause"} <= started, started
    assert started <= {*_build.GO_PROGRAMS, "pause"}, started - {*_build.GO_PROGRAMS, "pause"}


def test_one_module_requires_every_program_and_replaces_the_staging_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = {"k8s.io/kubernetes": ["k8s.io/api", "k8s.io/client-go"], "go.etcd.io/etcd/server/v3": ["go.etcd.io/etcd/api/v3"]}
    monkeypatch.setattr(_build, "_staging_replaces", lambda module, version, work: staging[module])
    _build._write_module(tmp_path)
    gomod = (tmp_path / "go.mod").read_text()
    for module, version, _ in _build.GO_MODULES:
        assert f"\t{module} {version}\n" in gomod
    assert "\tk8s.io/client-go => k8s.io/client-go v0" + _build.KUBERNETES_VERSION[2:] + "\n" in gomod
    assert f"\tgo.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 {_build.ETCD_VERSION}\n" in gomod
    # The module's own mains are the ones GO_PROGRAMS names.
    local = [package for package in _build.GO_PROGRAMS.values() if package.startswith("./")]
    assert local and all((tmp_path / package / "main.go").is_file() for package in local)
    # The programs' recipe names the cache folder: another version builds again.
    before = _build._programs_version()
    older_prometheus = tuple(
        (module, "v0.1.0" if module == "github.com/prometheus/prometheus" else version, release)
        for module, version, release in _build.GO_MODULES
    )
    monkeypatch.setattr(_build, "GO_MODULES", older_prometheus)
    assert _build._programs_version() != before


def test_helm_is_built_from_the_programs_module_with_their_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Go build cache is shared only by builds with the same module, tags, environment and
    compiler flags: helm's build and the programs' differ in their packages and link flags alone."""
    monkeypatch.setenv("STATEFLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_build, "_write_module", lambda work: work.mkdir(parents=True))
    builds: list[tuple[list[str], dict[str, str] | None]] = []

    def go(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
        builds.append((list(args), env))
        out = Path(args[args.index("-o") + 1])
        for package in args[args.index("-o") + 2 :]:
            (out / package.rsplit("/", 1)[-1]).write_text("")
        return ""

    monkeypatch.setattr(_build, "_go", go)
    dest = tmp_path / "helm-v3" / "helm"
    _build.build_helm(dest)
    assert dest.is_file() and [p.name for p in dest.parent.iterdir()] == ["helm"]  # its work folder removed
    _build.build_helm(dest)  # built: nothing to do
    for folder, build in (("runtime", _build._build_runtime), ("programs", _build._build_cluster_programs)):
        (tmp_path / folder).mkdir()
        build(tmp_path / folder, tmp_path / f"work-{folder}")
    assert len(builds) == 3
    (helm_args, helm_env), (runtime_args, runtime_env), (programs_args, programs_env) = builds

    def compile_flags(args: list[str]) -> list[str]:
        flags = args[: args.index("-o")]
        del flags[flags.index("-ldflags") : flags.index("-ldflags") + 2]
        return flags

    assert compile_flags(helm_args) == compile_flags(programs_args) and helm_env == programs_env
    assert runtime_args[: runtime_args.index("-o")] == programs_args[: programs_args.index("-o")] and runtime_env == programs_env
    assert runtime_args[runtime_args.index("-o") + 2 :] == list(_build.RUNTIME_PROGRAMS.values())
    assert helm_args[helm_args.index("-o") + 2 :] == [_build.HELM_PROGRAM]
    assert f"version.version={_build.HELM_VERSION}" in helm_args[helm_args.index("-ldflags") + 1]


def test_make_builds_the_helm_version_of_the_module() -> None:
    probe = "print-helm-version: ; @echo $(HELM_VERSION) $(HELM)"
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", f"--eval={probe}", "print-helm-version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == _build.HELM_VERSION and out[1].endswith(f"/kube/helm-{_build.HELM_VERSION}/helm"), out
    assert Path(out[1]) == _build.helm_binary()  # where the background build puts it first
