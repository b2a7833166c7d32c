"""The cluster's network on the host, confined to this machine, and the host's state it
changes, recorded at start and restored at stop.

- Pods live on one bridge in 198.18.0.0/24 and Services in 198.19.0.0/16: both inside the
  benchmark range 198.18.0.0/15 (RFC 2544), so they never shadow a private network the
  machine is on.
- Nothing is masqueraded, and a guard chain in the mangle table drops every packet routed
  between the bridge and any other interface: pods reach each other and this node (its
  API server, its CoreDNS, the Kafka broker bound to the bridge address) and nothing else.
- The guard is checked before the first pod starts (``require_guards``).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "sfkube0"
NODE_IP = "198.18.0.1"
POD_SUBNET = "198.18.0.0/24"
CLUSTER_CIDR = "198.18.0.0/16"
SERVICE_CIDR = "198.19.0.0/16"
API_SERVICE_IP = "198.19.0.1"
GUARD_CHAIN = "STATEFLEET-GUARD"

#: Kernel settings the cluster's parts change (the bridge plugin turns forwarding on, the
#: kubelet sets its kernel defaults, kube-proxy needs bridged traffic in iptables).
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/ipv4/conf/all/route_localnet",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


class NetworkError(RuntimeError):
    pass


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def read_sysctls() -> dict[str, str]:
    return {name: _sysctl_path(name).read_text().strip() for name in SYSCTLS if _sysctl_path(name).exists()}


@dataclass
class HostSnapshot:
    """What the host looked like before the cluster started: restored and compared at stop."""

    sysctls: dict[str, str]
    iptables: dict[str, list[str]]
    links: list[str]
    routes: list[str]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=1))

    @classmethod
    def load(cls, path: Path) -> HostSnapshot:
        return cls(**json.loads(path.read_text()))


def _iptables_rules() -> dict[str, list[str]]:
    """Each table's chains and rules, without counters (what ``-S`` prints)."""
    return {table: _run("iptables", "-t", table, "-S").stdout.splitlines() for table in ("filter", "nat", "mangle", "raw")}


def _links() -> list[str]:
    return sorted(line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link").stdout.splitlines())


def _routes() -> list[str]:
    return sorted(_run("ip", "route", "show", "table", "all").stdout.splitlines())


def snapshot_host() -> HostSnapshot:
    return HostSnapshot(read_sysctls(), _iptables_rules(), _links(), _routes())


def require_tools() -> None:
    missing = [tool for tool in ("ip", "iptables", "conntrack", "openssl") if shutil.which(tool) is None]
    if missing:
        raise NetworkError(f"the cluster needs {', '.join(missing)}: apt-get install iproute2 iptables conntrack openssl")
    if not Path("/usr/lib/cni/bridge").exists():
        raise NetworkError("the cluster's pod network uses the CNI plugins: apt-get install containernetworking-plugins")


def bridge_exists() -> bool:
    return _run("ip", "link", "show", BRIDGE, check=False).returncode == 0


def create_bridge() -> None:
    """The bridge and its address exist before the API server binds to it; the CNI bridge
    plugin finds it and adds each pod's veth. The Service range is routed to it so that
    the node reaches ClusterIPs the way pods do."""
    if not bridge_exists():
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
    if SERVICE_CIDR not in _run("ip", "route", "show", SERVICE_CIDR).stdout:
        _run("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)


def install_guards() -> None:
    """DROP anything routed between the bridge and any other interface (both directions)."""
    if _run("iptables", "-t", "mangle", "-S", GUARD_CHAIN, check=False).returncode != 0:
        _run("iptables", "-t", "mangle", "-N", GUARD_CHAIN)
    _run("iptables", "-t", "mangle", "-F", GUARD_CHAIN)
    _run("iptables", "-t", "mangle", "-A", GUARD_CHAIN, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
    _run("iptables", "-t", "mangle", "-A", GUARD_CHAIN, "!", "-i", BRIDGE, "-o", BRIDGE, "-j", "DROP")
    if _run("iptables", "-t", "mangle", "-C", "FORWARD", "-j", GUARD_CHAIN, check=False).returncode != 0:
        _run("iptables", "-t", "mangle", "-I", "FORWARD", "1", "-j", GUARD_CHAIN)


def guard_problems() -> list[str]:
    """What is missing of the confinement; empty when pods cannot reach past this node."""
    problems = []
    rules = _run("iptables", "-t", "mangle", "-S", GUARD_CHAIN, check=False).stdout
    for wanted in (f"-i {BRIDGE} ! -o {BRIDGE} -j DROP", f"! -i {BRIDGE} -o {BRIDGE} -j DROP"):
        if wanted not in rules:
            problems.append(f"mangle {GUARD_CHAIN} lacks `{wanted}`")
    forward = _run("iptables", "-t", "mangle", "-S", "FORWARD").stdout.splitlines()
    jumps = [line for line in forward if line.startswith("-A FORWARD")]
    if not jumps or jumps[0] != f"-A FORWARD -j {GUARD_CHAIN}":
        problems.append(f"mangle FORWARD does not jump to {GUARD_CHAIN} first")
    nat = _run("iptables", "-t", "nat", "-S").stdout
    for line in nat.splitlines():
        if "MASQUERADE" in line and "KUBE-" not in line.split("-j")[0] and BRIDGE in line:
            problems.append(f"a masquerade rule for the bridge: {line}")
    return problems


def require_guards() -> None:
    problems = guard_problems()
    if problems:
        raise NetworkError("the pod network is not confined to this machine: " + "; ".join(problems))


def guard_drops() -> int:
    """Packets the guard has dropped so far (both rules)."""
    out = _run("iptables", "-t", "mangle", "-L", GUARD_CHAIN, "-v", "-x", "-n", check=False).stdout
    return sum(int(line.split()[0]) for line in out.splitlines()[2:] if line.strip())


def set_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value)


def restore_host(before: HostSnapshot) -> list[str]:
    """Undo the cluster's changes to the host; returns what still differs from ``before``."""
    if bridge_exists():
        _run("ip", "link", "set", BRIDGE, "down", check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
    _run("ip", "route", "del", SERVICE_CIDR, check=False)
    # Rules and chains the cluster added, table by table: delete the added rules (in
    # reverse), then flush and delete the added chains.
    now = _iptables_rules()
    for table, rules in now.items():
        kept = set(before.iptables.get(table, []))
        for rule in reversed(rules):
            if rule in kept or not rule.startswith("-A "):
                continue
            _run("iptables", "-t", table, *shlex.split(rule.replace("-A ", "-D ", 1)), check=False)
        for rule in rules:
            if rule.startswith("-N ") and rule not in kept:
                _run("iptables", "-t", table, "-F", rule.split()[1], check=False)
        for rule in rules:
            if rule.startswith("-N ") and rule not in kept:
                _run("iptables", "-t", table, "-X", rule.split()[1], check=False)
    for name, value in before.sysctls.items():
        try:
            if _sysctl_path(name).read_text().strip() != value:
                set_sysctl(name, value)
        except OSError:
            pass
    _run("conntrack", "-D", "-s", CLUSTER_CIDR, check=False)
    after = snapshot_host()
    differences = []
    for name, value in before.sysctls.items():
        if after.sysctls.get(name) != value:
            differences.append(f"sysctl {name} is {after.sysctls.get(name)}, was {value}")
    for table in before.iptables:
        added = set(after.iptables[table]) - set(before.iptables[table])
        removed = set(before.iptables[table]) - set(after.iptables[table])
        differences += [f"iptables -t {table}: added {r}" for r in sorted(added)]
        differences += [f"iptables -t {table}: removed {r}" for r in sorted(removed)]
    differences += [f"link {link} was added" for link in sorted(set(after.links) - set(before.links))]
    differences += [f"route {route} was added" for route in sorted(set(after.routes) - set(before.routes))]
    return differences
