"""Starts and stops the single-node cluster: etcd, the control plane, containerd, the
kubelet, kube-proxy and CoreDNS, each a background process of the host with its pid file
and log under the cluster's home (``.local/kube`` unless ``STATEFLEET_KUBE_HOME``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import background
from tools.kube_cluster import _build, _network, _pki
from tools.processes import process_state

REPO = Path(__file__).resolve().parents[2]
NODE_NAME = "statefleet-node"
ETCD_PORT = 23790
API_PORT = 6443
PAUSE_IMAGE = "statefleet.local/pause:3.10"
STORAGE_CLASS = "statefleet-local"
#: hostPath volumes made ahead for the StatefulSets' claims.
VOLUMES = 16
VOLUME_SIZE = "10Gi"


class ClusterError(RuntimeError):
    """The cluster could not start or stop; the message says what to do."""


def log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def snapshot(self) -> Path:
        return self.root / "host-before.json"

    @property
    def volumes(self) -> Path:
        return self.root / "volumes"

    def pid_file(self, name: str) -> Path:
        return self.run / f"{name}.pid"


def default_home() -> Home:
    return Home(Path(os.environ.get("STATEFLEET_KUBE_HOME", REPO / ".local" / "kube")).resolve())


# -- processes -----------------------------------------------------------------------------


def _pid(home: Home, name: str) -> int | None:
    try:
        pid = int(home.pid_file(name).read_text())
    except (OSError, ValueError):
        return None
    return pid if process_state(pid) == "running" else None


def _start(
    home: Home, name: str, argv: Sequence[str | Path], env: dict[str, str] | None = None, lowest_priority: bool = False
) -> None:
    """Start ``argv`` in a session of its own; ``lowest_priority`` also puts that session's
    scheduling group at the lowest priority (a session started from a niced process
    otherwise competes with the test run as an equal, tools/background.py)."""
    if _pid(home, name) is not None:
        return
    home.logs.mkdir(parents=True, exist_ok=True)
    home.run.mkdir(parents=True, exist_ok=True)
    with (home.logs / f"{name}.log").open("ab") as out:
        process = subprocess.Popen(
            [str(a) for a in argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            preexec_fn=background.lowest_autogroup_priority if lowest_priority else None,
        )
    home.pid_file(name).write_text(str(process.pid))


def _stop(home: Home, name: str, timeout: float = 15.0) -> None:
    pid = _pid(home, name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while process_state(pid) == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        if process_state(pid) == "running":
            # An API server once ignored SIGTERM here: stop it for good.
            log(f"{name} did not stop within {timeout:.0f}s of SIGTERM: SIGKILL")
            os.kill(pid, signal.SIGKILL)
        while process_state(pid) in ("running", "exiting"):
            time.sleep(0.1)
    home.pid_file(name).unlink(missing_ok=True)


def _wait(what: str, check, timeout: float, home: Home, name: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if _pid(home, name) is None:
            tail = (home.logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
            raise ClusterError(f"{name} exited before {what}; the end of {home.logs / (name + '.log')}:\n" + "\n".join(tail))
        time.sleep(0.2)
    raise ClusterError(f"{what} did not happen within {timeout:.0f}s: see {home.logs / (name + '.log')}")


def _https_ok(home: Home, url: str) -> bool:
    context = ssl.create_default_context(cafile=str(home.pki / "ca.crt"))
    context.load_cert_chain(str(home.pki / "admin.crt"), str(home.pki / "admin.key"))
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def kubectl(home: Home, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(_build.binary("kubectl")), "--kubeconfig", str(home.kubeconfig), *args], capture_output=True, text=True, input=input
    )
    if check and result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result


# -- configuration files --------------------------------------------------------------------


def _write_kubeconfig(home: Home) -> None:
    pki = home.pki
    home.kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "statefleet",
                        "cluster": {
                            "server": f"https://{_network.NODE_IP}:{API_PORT}",
                            "certificate-authority": str(pki / "ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "admin",
                        "user": {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")},
                    }
                ],
                "contexts": [{"name": "statefleet", "context": {"cluster": "statefleet", "user": "admin"}}],
                "current-context": "statefleet",
            },
            indent=1,
        )
    )
    home.kubeconfig.chmod(0o600)


def _containerd_config(home: Home) -> Path:
    root = home.root / "containerd"
    path = root / "config.toml"
    root.mkdir(parents=True, exist_ok=True)
    cni = home.root / "cni"
    path.write_text(
        f"""version = 3
root = "{root / "root"}"
state = "{home.run / "containerd"}"

[grpc]
  address = "{home.containerd_socket}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE on these machines: without this runc fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{shutil.which("runc") or "/usr/sbin/runc"}"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni / "net.d"}"
"""
    )
    (cni / "net.d").mkdir(parents=True, exist_ok=True)
    (cni / "net.d" / "10-statefleet.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "statefleet",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": _network.BRIDGE,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(cni / "ipam"),
                            "ranges": [[{"subnet": _network.POD_SUBNET, "gateway": _network.NODE_IP}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    }
                ],
            },
            indent=1,
        )
    )
    return path


def _kubelet_config(home: Home) -> Path:
    path = home.root / "kubelet-config.json"
    resolv = home.root / "resolv.conf"
    # Pods with dnsPolicy Default get this file: the cluster's CoreDNS and nothing upstream.
    resolv.write_text(f"nameserver {_network.NODE_IP}\n")
    path.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": _network.NODE_IP,
                "healthzBindAddress": "127.0.0.1",
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": True},
                    "x509": {"clientCAFile": str(home.pki / "ca.crt")},
                },
                "authorization": {"mode": "Webhook"},
                # cgroup v1 and no systemd on these machines.
                "cgroupDriver": "cgroupfs",
                "failCgroupV1": False,
                "failSwapOn": False,
                "clusterDNS": [_network.NODE_IP],
                "clusterDomain": "cluster.local",
                "containerRuntimeEndpoint": f"unix://{home.containerd_socket}",
                "resolvConf": str(resolv),
                "podCIDR": _network.POD_SUBNET,
                "serializeImagePulls": False,
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                # A shared build machine's disk and memory are not the pods' to guard.
                "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
                "protectKernelDefaults": False,
                "maxPods": 60,
            },
            indent=1,
        )
    )
    return path


def _kube_proxy_config(home: Home) -> Path:
    path = home.root / "kube-proxy-config.json"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "mode": "iptables",
                "clientConnection": {"kubeconfig": str(home.kubeconfig)},
                "hostnameOverride": NODE_NAME,
                "clusterCIDR": _network.CLUSTER_CIDR,
                "bindAddress": _network.NODE_IP,
                "healthzBindAddress": "127.0.0.1:10256",
                "metricsBindAddress": "127.0.0.1:10249",
                # Leave the host's conntrack limits alone.
                "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
                # NodePorts on the bridge address only: never route_localnet, never another interface.
                "nodePortAddresses": [f"{_network.NODE_IP}/32"],
            },
            indent=1,
        )
    )
    return path


def _corefile(home: Home) -> Path:
    path = home.root / "Corefile"
    # No `forward`: a name outside the cluster does not resolve, so pods look up nothing
    # beyond this machine.
    path.write_text(
        f""".:53 {{
    bind {_network.NODE_IP}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {home.kubeconfig} statefleet
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""
    )
    return path


# -- images ---------------------------------------------------------------------------------


def _containerd_lock(home: Home) -> contextlib.AbstractContextManager[None]:
    """Held while an image is copied into the cluster's containerd (``load_image``,
    ``preload_image``) and while ``up`` starts containerd: a check that needs the image waits
    for a copy under way, then finds the image there."""
    return background.exclusive(home.root / "containerd.lock", "image load into the cluster's containerd", log)


def _start_containerd(home: Home, lowest_priority: bool = False) -> None:
    _start(
        home,
        "containerd",
        [_build.binary("containerd"), "--config", _containerd_config(home)],
        env={"PATH": f"{_build.RUNTIME_BUILD.bin}:{os.environ.get('PATH', '')}"},  # its runc shim
        lowest_priority=lowest_priority,
    )
    _wait("containerd answering", lambda: _ctr(home, "version").returncode == 0, 30, home, "containerd")


def _ctr(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_build.binary("ctr")), "--address", str(home.containerd_socket), "-n", "k8s.io", *args],
        capture_output=True,
        text=True,
    )


def image_present(home: Home, ref: str) -> bool:
    return ref in _ctr(home, "images", "ls", "-q").stdout.split()


def import_archive(home: Home, archive: Path) -> None:
    result = _ctr(home, "images", "import", "--no-unpack=false", str(archive))
    if result.returncode != 0:
        raise ClusterError(f"ctr images import {archive} failed: {result.stderr.strip()}")


def _ensure_pause_image(home: Home) -> None:
    """The pod sandbox image, packed from the pause binary (no registry is reachable)."""
    if image_present(home, PAUSE_IMAGE):
        return
    archive = home.root / "pause.tar"
    if not archive.exists():
        from tools.image_build import buildah

        container = buildah("from", "scratch", capture=True).stdout.strip()
        try:
            buildah("copy", "--quiet", container, str(_build.binary("pause")), "/pause")
            buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container)
            buildah("commit", "--quiet", container, PAUSE_IMAGE, capture=True)
        finally:
            buildah("rm", container, capture=True, check=False)
        buildah("push", "--quiet", PAUSE_IMAGE, f"docker-archive:{archive}:{PAUSE_IMAGE}", capture=True)
    import_archive(home, archive)


def _loaded_file(home: Home) -> Path:
    """Which image ID each tag was loaded from: ``ctr`` lists the digest of the archive it
    imported, which is not the ID buildah knows the image by."""
    return home.root / "containerd" / "loaded-images.json"


def load_image(home: Home, image: str, tag: str) -> None:
    """Copies ``image`` (an ID or name in the image store `make image` builds into) into the
    cluster's containerd as ``tag``, unless it holds that image already. A preload copying it
    finishes first (in the cold run of ``a63fba3`` the check copied it a second time beside the
    preload's copy: 61 s)."""
    with _containerd_lock(home):
        _load_image(home, image, tag)


def _load_image(home: Home, image: str, tag: str) -> None:
    """``load_image`` for a caller that holds ``_containerd_lock``."""
    from tools.image_build import buildah

    image_id = buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", image, capture=True).stdout.strip()
    ref = tag if "/" in tag.split(":")[0] else f"docker.io/library/{tag}"
    loaded_file = _loaded_file(home)
    loaded: dict[str, str] = json.loads(loaded_file.read_text()) if loaded_file.exists() else {}
    if image_id and loaded.get(ref) == image_id and image_present(home, ref):
        log(f"{tag} is in the cluster already ({image_id[:12]})")
        return
    archive = home.root / "image.tar"
    started = time.monotonic()
    archive.unlink(missing_ok=True)
    buildah("push", "--quiet", image, f"docker-archive:{archive}:{tag}", capture=True)
    import_archive(home, archive)
    archive.unlink(missing_ok=True)
    loaded_file.parent.mkdir(parents=True, exist_ok=True)
    loaded_file.write_text(json.dumps({**loaded, ref: image_id}))
    log(f"loaded {tag} into the cluster's containerd in {time.monotonic() - started:.0f}s")


def preload_image(home: Home, build_image: Callable[[], str], tag: str) -> None:
    """Loads the image into the containerd store of a cluster that is not up yet, so that
    ``make kube-check`` finds it there (`make test` runs this beside its suites, at the
    lowest priority: the copy of 1.5 GB took 26 to 52 s on the check's clock).

    Waits for containerd, ctr and pause (``build_for_preload``: the background build makes
    them first) and for the image (``build_image`` returns its ID once built), then starts
    containerd alone, imports the pause image and the image, and stops it; on a cold machine
    that is done while the cluster's other programs compile. ``up`` and ``load_image`` wait
    for a preload in progress."""
    require_root()
    _build.build_for_preload()
    image = build_image()
    with _containerd_lock(home):
        started_here = _pid(home, "containerd") is None
        _start_containerd(home, lowest_priority=True)
        try:
            _ensure_pause_image(home)
            _load_image(home, image, tag)
        finally:
            if started_here:
                _stop(home, "containerd")


# -- storage --------------------------------------------------------------------------------


def _volume_folder(path: Path) -> None:
    """A volume's folder, writable by any pod's user: the kubelet applies a pod's fsGroup to
    the volumes it manages, not to hostPath ones (local-path provisioners do the same)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)


def _storage(home: Home) -> None:
    """A no-provisioner StorageClass (the default) and hostPath volumes made ahead."""
    manifests: list[dict[str, object]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate",  # one node: nothing to wait for, and `helm --wait` waits for every claim to bind
            "reclaimPolicy": "Retain",
        }
    ]
    for index in range(VOLUMES):
        path = home.volumes / f"pv-{index:02d}"
        _volume_folder(path)
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"statefleet-pv-{index:02d}", "labels": {"statefleet.io/local-volume": "true"}},
                "spec": {
                    "capacity": {"storage": VOLUME_SIZE},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                },
            }
        )
    kubectl(home, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))


def release_volumes(home: Home) -> list[str]:
    """Volumes whose claim is gone are made Available again, their data wiped (what a
    provisioner's Delete policy does). Returns the names released."""
    listing = json.loads(kubectl(home, "get", "pv", "-l", "statefleet.io/local-volume=true", "-o", "json").stdout)
    released = []
    for pv in listing["items"]:
        if pv["status"].get("phase") != "Released":
            continue
        path = Path(pv["spec"]["hostPath"]["path"])
        shutil.rmtree(path, ignore_errors=True)
        _volume_folder(path)
        kubectl(home, "patch", "pv", pv["metadata"]["name"], "--type", "json", "-p", '[{"op":"remove","path":"/spec/claimRef"}]')
        released.append(pv["metadata"]["name"])
    return released


# -- up and down ----------------------------------------------------------------------------


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError(
            "the cluster needs root: it creates a network bridge and iptables rules, and containerd and the kubelet "
            "mount volumes and make cgroups. Run `sudo make cluster-up` (or as root)."
        )


def up(home: Home) -> None:
    started = time.monotonic()
    require_root()
    _network.require_tools()
    _build.build_all()
    home.root.mkdir(parents=True, exist_ok=True)
    if not home.snapshot.exists():
        _network.snapshot_host().save(home.snapshot)
    _network.create_bridge()
    # Confinement comes first: the guard is in place before anything can send a packet.
    _network.install_guards()
    _network.require_guards()
    _network.set_sysctl("net/bridge/bridge-nf-call-iptables", "1")  # Services between pods on the bridge
    _pki.make_pki(home.pki, [_network.NODE_IP, _network.API_SERVICE_IP, "127.0.0.1"])
    _write_kubeconfig(home)
    pki = home.pki
    _start(
        home,
        "etcd",
        [
            _build.binary("etcd"),
            "--name=statefleet",
            f"--data-dir={home.root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{ETCD_PORT}",
            f"--advertise-client-urls=http://127.0.0.1:{ETCD_PORT}",
            f"--listen-peer-urls=http://127.0.0.1:{ETCD_PORT + 1}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PORT + 1}",
            f"--initial-cluster=statefleet=http://127.0.0.1:{ETCD_PORT + 1}",
            "--listen-metrics-urls=",
            "--quota-backend-bytes=2147483648",
        ],
    )
    _start(
        home,
        "kube-apiserver",
        [
            _build.binary("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            f"--bind-address={_network.NODE_IP}",
            f"--advertise-address={_network.NODE_IP}",
            f"--secure-port={API_PORT}",
            f"--service-cluster-ip-range={_network.SERVICE_CIDR}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC",
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            # The node's name does not resolve here; its address does.
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=false",
            "--event-ttl=10m",
        ],
    )
    _wait(
        "the API server answering",
        lambda: _https_ok(home, f"https://{_network.NODE_IP}:{API_PORT}/readyz"),
        90,
        home,
        "kube-apiserver",
    )
    log(f"API server ready {time.monotonic() - started:.1f}s after start")
    kubeconfig = f"--kubeconfig={home.kubeconfig}"
    _start(
        home,
        "kube-controller-manager",
        [
            _build.binary("kube-controller-manager"),
            kubeconfig,
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={_network.SERVICE_CIDR}",
            f"--cluster-cidr={_network.CLUSTER_CIDR}",
            "--allocate-node-cidrs=false",
        ],
    )
    _start(
        home, "kube-scheduler", [_build.binary("kube-scheduler"), kubeconfig, "--bind-address=127.0.0.1", "--leader-elect=false"]
    )
    with _containerd_lock(home):  # a preload in progress finishes first (preload_image)
        _start_containerd(home)
        _ensure_pause_image(home)
    _start(
        home,
        "kubelet",
        [
            _build.binary("kubelet"),
            f"--config={_kubelet_config(home)}",
            kubeconfig,
            f"--root-dir={home.root / 'kubelet'}",
            f"--node-ip={_network.NODE_IP}",
            f"--hostname-override={NODE_NAME}",
        ],
    )
    _start(home, "kube-proxy", [_build.binary("kube-proxy"), f"--config={_kube_proxy_config(home)}"])
    _start(home, "coredns", [_build.binary("coredns"), "-conf", _corefile(home)])

    def node_ready() -> bool:
        out = kubectl(
            home, "get", "node", NODE_NAME, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
        )
        return out.stdout.strip() == "True"

    _wait("the node being Ready", node_ready, 120, home, "kubelet")
    log(f"node Ready {time.monotonic() - started:.1f}s after start")

    def default_account() -> bool:
        return kubectl(home, "get", "serviceaccount", "default", check=False).returncode == 0

    _wait("the default service account", default_account, 60, home, "kube-controller-manager")
    _storage(home)
    _network.require_guards()
    log(f"cluster up in {time.monotonic() - started:.1f}s: export KUBECONFIG={home.kubeconfig}")


COMPONENTS = (
    "coredns",
    "kube-proxy",
    "kubelet",
    "containerd",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)


def running(home: Home) -> dict[str, int | None]:
    return {name: _pid(home, name) for name in COMPONENTS}


def _mounts_under(paths: Sequence[Path]) -> list[str]:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    prefixes = [str(p) for p in paths]
    return [m for m in mounts if any(m == p or m.startswith(p + "/") for p in prefixes)]


def down(home: Home, wipe: bool = True) -> list[str]:
    """Stops everything, removes the pods' containers, mounts and cgroups, and restores the
    host; returns what still differs from before ``up`` (empty when the host is as it was)."""
    require_root()
    if _pid(home, "containerd") is not None and _pid(home, "kubelet") is not None:
        _stop(home, "kubelet")
    crictl = _build.GO_PROGRAMS_BUILD.bin / "crictl"
    if _pid(home, "containerd") is not None and crictl.exists():
        endpoint = f"unix://{home.containerd_socket}"
        subprocess.run([str(crictl), "-r", endpoint, "rmp", "-a", "-f"], capture_output=True, timeout=180)
    for name in COMPONENTS:
        _stop(home, name)
    # Shims left behind (a containerd killed before its pods) and their containers.
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and str(home.run).encode() in b" ".join(cmdline):
                os.kill(int(proc.name), signal.SIGKILL)
    for mount in sorted(_mounts_under([home.root, Path("/run/netns")]), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)
    for netns in Path("/run/netns").glob("cni-*"):
        netns.unlink(missing_ok=True)
    _remove_cgroups()
    differences: list[str] = []
    if home.snapshot.exists():
        differences = _network.restore_host(_network.HostSnapshot.load(home.snapshot))
    if wipe:
        shutil.rmtree(home.root, ignore_errors=True)
    return differences


def _remove_cgroups() -> None:
    """The kubelet's cgroups (``kubepods``), leaves first."""
    root = Path("/sys/fs/cgroup")
    for controller in root.iterdir() if root.exists() else []:
        top = controller / "kubepods"
        if not top.is_dir():
            continue
        for path in [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True), top]:
            with contextlib.suppress(OSError):
                path.rmdir()
