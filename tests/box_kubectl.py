"""TEST ONLY: the stand-in kubectl on the CLI's machine of the lab in a box.

A failure drill (`python -m components drill ...`, components/tools/drills) runs kubectl where the
Pulumi CLI runs, not on a node: in the box that is the engine's network namespace (tests/lab_box.py
`LabBox.engine_netns`), whose bridge reaches the nodes and the VIP. There is no kubectl package
there, so `write_launcher` writes an executable that runs the same stand-in a node's kubectl
package runs (tests/tools/box/standin/main.py `kubectl`, i.e. box_cluster.kubectl_main) from this
checkout:

    python3 tests/tools/box/standin/main.py kubectl ARGS

with
- LABS_K8S_BOX_STORE: the box's cluster store (`LabBox.store`), which the stand-in answers from;
- PYTHONPATH: tests/, for kube_standin.py (on a node the package puts it beside main.py, under
  /usr/lib/labs-k8s-standin/<package>/; main.py puts its own directory, with box_cluster, daemons
  and net, first on sys.path);
- optionally `ip netns exec NETNS` in front, so the launcher can be called from the root namespace.

What needs no host file: the drill's kubeconfig is the stack's `kubeconfig` output (admin
credentials embedded, server https://VIP:6443) in a temp file (`KubectlCluster`); the stand-in
reads its CA and client certificate from it, makes the real HTTPS request to --server (the VIP:
HAProxy, then an API server, which checks the certificate), and answers from the store. Nothing
of a node's disk is read (box_cluster.check_client_files only follows file paths a kubeconfig
names; this one names none). `kubectl exec` into an etcd pod dials the pod's kubelet port over the
lab network and runs etcdctl's model against the members' peer ports, as from a node.

Use: `KubectlCluster(kubeconfig, api_endpoint, kubectl=str(write_launcher(path, box.store,
netns=box.engine_netns)))`, or `python -m components drill ... --kubectl <launcher>`.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDIN_MAIN = REPO / "tests" / "tools" / "box" / "standin" / "main.py"
TESTS = REPO / "tests"


def kubectl_env(store: Path) -> dict[str, str]:
    """The variables the stand-in kubectl needs beyond a plain environment."""
    return {"LABS_K8S_BOX_STORE": str(store), "PYTHONPATH": str(TESTS)}


def kubectl_argv(*args: str, python: str = sys.executable, netns: str | None = None) -> list[str]:
    """The command line of the stand-in kubectl with ARGS (run it with `kubectl_env` added)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return [*prefix, python, str(STANDIN_MAIN), "kubectl", *args]


def write_launcher(path: Path, store: Path, netns: str | None = None, python: str = sys.executable) -> Path:
    """An executable at `path` that is kubectl for the drills: `path ARGS` runs the stand-in with
    ARGS in `netns` (None: where it is called), against the store. `python` needs PyYAML (the
    project's virtualenv has it)."""
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in kubectl_env(store).items())
    command = " ".join(shlex.quote(part) for part in kubectl_argv(python=python, netns=netns))
    path.write_text(
        "#!/bin/sh\n# labs-k8s lab in a box (test only): the stand-in kubectl on the CLI's machine "
        f'(tests/box_kubectl.py)\n{exports}exec {command} "$@"\n'
    )
    os.chmod(path, 0o755)
    return path
