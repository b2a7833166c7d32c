"""The cluster's configuration files, without a cluster: what keeps it on this machine and
what these machines need (docs/kubernetes.md#a-cluster-on-this-machine)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from tools.kube_cluster import _network, _node

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
