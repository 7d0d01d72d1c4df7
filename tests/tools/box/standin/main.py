"""TEST ONLY: the entry point of the lab in a box's Kubernetes stand-ins on a node host.

Each stand-in package (tests/box_repo.py) installs a copy of this directory and of
tests/kube_standin.py under /usr/lib/labs-k8s-standin/<package>/, with its release.json, and
launchers `/usr/bin/<command>` that run `python3 main.py <command> ARGS`. What each command does,
and what is real in it: box_cluster.py (kubeadm, kubectl, crictl) and daemons.py (kubelet,
containerd, the static pods).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import box_cluster
import daemons

COMMANDS = {
    "kubeadm": box_cluster.kubeadm_main,
    "kubectl": box_cluster.kubectl_main,
    "crictl": box_cluster.crictl_main,
    "kubelet": daemons.kubelet_main,
    "containerd": daemons.containerd_main,
    "static-pod": daemons.static_pod_main,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in COMMANDS:
        print(f"labs-k8s stand-in: usage: main.py {{{','.join(COMMANDS)}}} ARGS", file=sys.stderr)
        return 2
    return COMMANDS[argv[1]](argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
