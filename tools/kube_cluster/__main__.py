"""A real single-node Kubernetes cluster on this machine, built from the Go module proxy.

    python -m tools.kube_cluster build       build the binaries into the cache (once)
    python -m tools.kube_cluster build --background
                                             the same in a process of its own, at the lowest
                                             priority (make test starts it first, when needed)
    python -m tools.kube_cluster up          build, then start the cluster (root)
    python -m tools.kube_cluster down        stop it and restore the host (root)
    python -m tools.kube_cluster status      what runs
    python -m tools.kube_cluster load-image IMAGE [--tag statefleet:0.1.0]
    python -m tools.kube_cluster preload [--background] [--tag T] [--bases B] [--iidfile F]
                                             build the image (as `make image`) and load it into
                                             the containerd of a cluster not yet up (root; make
                                             test starts it in the background)
    python -m tools.kube_cluster env         the KUBECONFIG line to export

See docs/kubernetes.md#a-cluster-on-this-machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from tools import background
from tools.kube_cluster import _build, _network, _node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kube_cluster", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the binaries into the cache")
    build.add_argument(
        "--background", action="store_true", help="build in a process of its own at the lowest CPU and I/O priority, and return"
    )
    helm = sub.add_parser("build-helm", help="build helm from the module of the cluster's programs (make helm-check's)")
    helm.add_argument("dest", type=Path, help="the file to build it into (nothing is built when it exists)")
    sub.add_parser("up", help="start the cluster (builds first)")
    down = sub.add_parser("down", help="stop the cluster and restore the host")
    down.add_argument("--keep", action="store_true", help="keep the cluster's home (etcd, volumes, logs) for a later `up`")
    sub.add_parser("status", help="what runs")
    load = sub.add_parser("load-image", help="copy an image from the buildah store into the cluster")
    load.add_argument("image")
    load.add_argument("--tag", default="statefleet:0.1.0")
    preload = sub.add_parser("preload", help="build the image and load it into the containerd of a cluster not yet up")
    preload.add_argument("--tag", default="statefleet:0.1.0")
    preload.add_argument("--bases", default="auto", help="as make image's IMAGE_BASES")
    preload.add_argument("--iidfile", type=Path, default=Path(".local", "image-id"), help="as make image's")
    preload.add_argument(
        "--background", action="store_true", help="in a process of its own at the lowest CPU and I/O priority, and return"
    )
    sub.add_parser("env", help="print the KUBECONFIG line to export")
    args = parser.parse_args(argv)
    home = _node.default_home()
    try:
        if args.command == "build" and args.background:
            log = Path(".local", "kube-build.log").resolve()
            pid = _build.build_in_background(log)
            if pid is not None:
                names = ", ".join(_build.to_build())
                print(f"[cluster] building {names} in the background (pid {pid}, lowest priority; log: {log})", file=sys.stderr)
        elif args.command == "build":
            _build.build_all()
        elif args.command == "build-helm":
            _build.build_helm(args.dest.resolve())
        elif args.command == "up":
            _node.up(home)
        elif args.command == "down":
            differences = _node.down(home, wipe=not args.keep)
            if differences:
                print("[cluster] the host differs from before `cluster-up`:\n  " + "\n  ".join(differences), file=sys.stderr)
                return 1
            print("[cluster] stopped; the host's links, routes, iptables rules and sysctls are as before", file=sys.stderr)
        elif args.command == "status":
            for name, pid in _node.running(home).items():
                print(f"{name:24} {'running, pid ' + str(pid) if pid else 'stopped'}")
            problems = _network.guard_problems() if _network.bridge_exists() else ["no bridge: the cluster is down"]
            print("network guard: " + ("in place" if not problems else "; ".join(problems)))
            return 0 if all(_node.running(home).values()) else 1
        elif args.command == "load-image":
            _node.load_image(home, args.image, args.tag)
        elif args.command == "preload" and args.background:
            if os.geteuid() != 0 or shutil.which("buildah") is None:
                print("[cluster] no image preload: it needs root and buildah (kube-check loads the image)", file=sys.stderr)
                return 0
            forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--background"]
            log = Path(".local", "kube-preload.log").resolve()
            pid = background.start_at_lowest_priority(["tools.kube_cluster", *forwarded], log)
            print(f"[cluster] loading {args.tag} into the cluster's containerd (pid {pid}; log: {log})", file=sys.stderr)
        elif args.command == "preload":
            iidfile: Path = args.iidfile.resolve()

            def build_image() -> str:
                from tools import image_build

                image_build.main(["--tag", args.tag, "--bases", args.bases, "--iidfile", str(iidfile)])
                return iidfile.read_text().strip()

            _node.preload_image(home, build_image, args.tag)
        elif args.command == "env":
            print(f"export KUBECONFIG={home.kubeconfig}")
    except (_node.ClusterError, _build.BuildError, _network.NetworkError) as error:
        print(f"[cluster] {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
