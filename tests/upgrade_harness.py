"""A kubeadm cluster of stand-ins for the upgrade steps: several nodes, one API.

Each node is a ShellHarness (its own fake root, state and call log), and all of them share one
cluster directory, the API side: the kubeadm-config version, Node objects (kubelet version, Ready,
cordon, annotations, container runtime), the control-plane mirror pods, etcd members. So a chain of
real scripts can run node after node, and the tests read back one log of every command every node
issued, in order.

The stand-ins model the real tools' behaviour and failure points (sources cited at each):
- `kubeadm upgrade plan|apply|node`, `kubeadm version`, `kubeadm config images list`;
- `kubectl` get/annotate/drain/uncordon/exec, with admin.conf (cluster-admin) or a node's kubelet.conf
  (which may only read);
- `etcdctl snapshot save` and `endpoint health`, run through `kubectl exec` in the etcd pod;
- `apt-get`/`apt-cache`: one pkgs.k8s.io repository per minor, seen only after `apt-get update`, and
  held packages that change only with --allow-change-held-packages;
- `systemctl restart kubelet`: the node reports the kubelet version installed;
- `curl` to an apiserver: it answers when the test says so.

tests/kube_standin.py models kubeadm init/join/reset; this models the upgrade workflow, which only
ever runs on a cluster that is complete: the two never run in the same test.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from components.config import LabConfig, Node
from components.rendering import STEP_ROOT, k8s
from tests.labs import make_lab_config
from tests.shell_harness import DEFAULT_STUBS, ShellHarness
from tests.test_k8s_scripts import fresh_debian_node

VIP = "10.3.60.100"

# Every stand-in logs to its node's log (as in shell_harness) and to the cluster's shared log,
# prefixed with the node's name, so a test sees the order across nodes.
_PRELUDE = r"""#!/bin/bash
# shellcheck disable=SC2034 # the prelude's names (ROOT, VIP...) are not used by every stand-in
# stand-in for {name} (tests/upgrade_harness.py)
ROOT=$LABS_K8S_ROOT
STATE=$HARNESS_STATE
CLUSTER=$STATE/cluster
SELF=""
[[ -f $STATE/node-name ]] && read -r SELF <"$STATE/node-name"
__line={name}
for __arg in "$@"; do __line+=$'\x1f'"${{__arg//$'\n'/\\n}}"; done
printf '%s\n' "$__line" >>"$HARNESS_LOG"
[[ -d $CLUSTER ]] && printf '%s\x1f%s\n' "$SELF" "$__line" >>"$CLUSTER/calls.log"
"""

STANDINS = Path(__file__).with_name("standins")


def _standin(*names: str) -> str:
    return "\n".join((STANDINS / f"{name}.bash").read_text() for name in names)


class UpgradeNode(ShellHarness):
    """One node of a FakeCluster: a ShellHarness whose stand-ins reach the shared API."""

    def stub(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(_PRELUDE.format(name=name) + body.strip() + "\n")
        path.chmod(0o755)


class FakeCluster:
    """The API side of a kubeadm cluster, shared by the nodes' harnesses (one directory)."""

    def __init__(self, base: Path, version: str) -> None:
        self.base = base
        self.dir = base / "cluster"
        for sub in ("nodes", "pods", "etcd"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "version").write_text(f"{version}\n")
        (self.dir / "calls.log").touch()
        self.nodes: dict[str, UpgradeNode] = {}

    @classmethod
    def copy(cls, template: Path, base: Path) -> FakeCluster:
        """A copy of a cluster tree, with fresh harnesses (stand-ins, links to real tools) over it."""

        def harness_dirs(directory: str, names: list[str]) -> set[str]:
            # Each node's own bin directories are rebuilt; a node's /opt/cni/bin is data.
            return {"bin", "safe-bin"} & set(names) if Path(directory).parent == template else set()

        shutil.copytree(template, base, symlinks=True, ignore=harness_dirs)
        cluster = cls.__new__(cls)
        cluster.base = base
        cluster.dir = base / "cluster"
        cluster.nodes = {}
        for node in sorted((cluster.dir / "nodes").iterdir()):
            harness = cluster.harness(node.name)
            # The mount stand-ins key their state on absolute paths under the node's root.
            mounts = harness.state / "mounts"
            for record in mounts.iterdir() if mounts.is_dir() else ():
                old_root = str(template / node.name / "root").replace("/", "_")
                record.rename(mounts / record.name.replace(old_root, str(harness.root).replace("/", "_")))
        return cluster

    def harness(self, name: str) -> UpgradeNode:
        """The node's harness with the cluster's stand-ins (a new one, or one over a copied tree)."""
        node = UpgradeNode(self.base / name)
        link = node.state / "cluster"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(self.dir)
        node.set_state("node-name", name)
        stubs = {
            "kubeadm": _standin("versions", "kubeadm"),
            "kubectl": _standin("versions", "etcdctl", "kubectl"),
            "apt-get": _standin("apt-get"),
            "apt-cache": _standin("apt-cache"),
            "apt-mark": _standin("apt-mark"),
            "curl": _standin("curl"),
            "systemctl": _standin("versions", "systemctl-kubelet") + DEFAULT_STUBS["systemctl"],
        }
        for stub_name, body in stubs.items():
            node.stub(stub_name, f"VIP={VIP}\n" + body)
        self.nodes[name] = node
        return node

    def add_node(self, name: str, ip: str, role: str, repositories: dict[str, dict[str, list[str]]]) -> UpgradeNode:
        """A new node, its pkgs.k8s.io repositories (minor -> package -> versions, newest first)."""
        node = self.harness(name)
        for minor, packages in repositories.items():
            for package, versions in packages.items():
                node.set_state(f"repos/{minor}/{package}", "".join(f"{v}\n" for v in versions))
        registered = self.dir / "nodes" / name
        (registered / "annotations").mkdir(parents=True)
        for field, value in (
            ("role", role),
            ("ip", ip),
            ("ready", "False"),
            ("kubelet", ""),
            ("runtime", ""),
            ("workloads", ""),
        ):
            (registered / field).write_text(f"{value}\n" if value else "")
        return node

    def join(self, name: str, version: str) -> None:
        """What kubeadm init/join leave behind on a prepared node at `version`: kubelet.conf (and on a
        control plane admin.conf, static pod manifests, the mirror pods, an etcd member), a Ready Node."""
        node = self.nodes[name]
        registered = self.dir / "nodes" / name
        role = (registered / "role").read_text().strip()
        node.write("/etc/kubernetes/kubelet.conf", f"clusters:\n- cluster:\n    server: https://{VIP}:6443\n")
        (registered / "kubelet").write_text(f"{version}\n")
        (registered / "ready").write_text("True\n")
        runtime = (node.state / "containerd-version").read_text().strip()
        (registered / "runtime").write_text(f"containerd://{runtime}\n")
        node.set_state(f"api/{VIP}")
        if role != "control-plane":
            return
        node.write(
            "/etc/kubernetes/admin.conf",
            (
                f"apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: AAAA\n    server: https://{VIP}:6443\n"
                "  name: labs-k8s\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: original\n"
            ),
        )
        minor = int(version.split(".")[1])
        etcd = "3.6.6-0" if minor >= 34 else "3.5.24-0"
        for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            tag = etcd if component == "etcd" else version
            node.write(
                f"/etc/kubernetes/manifests/{component}.yaml",
                f"apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: {component}\n"
                f"    image: registry.k8s.io/{component}:{tag}\n",
            )
            pod = self.dir / "pods" / f"{component}-{name}"
            pod.mkdir()
            (pod / "image").write_text(f"registry.k8s.io/{component}:{tag}\n")
            (pod / "phase").write_text("Running\n")
            (pod / "node").write_text(f"{name}\n")
        (self.dir / "etcd" / (registered / "ip").read_text().strip()).write_text("true\n")
        node.set_state("api/127.0.0.1")

    # ------------------------------------------------------------------ changing it
    def node_file(self, name: str, field: str) -> Path:
        return self.dir / "nodes" / name / field

    def set_node(self, name: str, field: str, value: str | None) -> None:
        path = self.node_file(name, field)
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{value}\n")

    # ------------------------------------------------------------------ reading it back
    @property
    def version(self) -> str:
        return (self.dir / "version").read_text().strip()

    def kubelet(self, name: str) -> str:
        return self.node_file(name, "kubelet").read_text().strip()

    def cordoned(self, name: str) -> bool:
        return self.node_file(name, "unschedulable").exists()

    def annotations(self, name: str) -> dict[str, str]:
        directory = self.node_file(name, "annotations")
        return {path.name.replace("%2F", "/"): path.read_text() for path in directory.iterdir()}

    def pod_image(self, pod: str) -> str:
        return (self.dir / "pods" / pod / "image").read_text().strip()

    def calls(self) -> list[list[str]]:
        """Every stand-in invocation on every node, in order: [node, command, arg...]."""
        return [line.split("\x1f") for line in (self.dir / "calls.log").read_text().splitlines()]

    def reset_log(self) -> None:
        (self.dir / "calls.log").write_text("")
        for node in self.nodes.values():
            node.reset_log()

    def snapshot(self) -> dict[str, bytes]:
        """The API side and every node's root, without the step bundles each step writes for itself
        (/var/lib/labs-k8s/steps): compare two runs with it."""
        state = {
            str(p.relative_to(self.dir)): p.read_bytes()
            for p in sorted(self.dir.rglob("*"))
            if p.is_file() and p.name != "calls.log"
        }
        for name, node in self.nodes.items():
            state.update(
                {
                    f"{name}:{key}": value
                    for key, value in node.snapshot().items()
                    if not key.startswith("var/lib/labs-k8s/steps/")
                }
            )
        return state


# ------------------------------------------------------------------ the lab and its upgrade chain

OLD = "v1.35.2"
NODES = {
    "labs-k8s-m01": ("10.3.60.51", "control-plane", 20),
    "labs-k8s-m02": ("10.3.60.52", "control-plane", 20),
    "labs-k8s-m03": ("10.3.60.53", "control-plane", 20),
    "labs-k8s-w01": ("10.3.60.54", "worker", 50),
    "labs-k8s-w02": ("10.3.60.55", "worker", 50),
}
K8S = ("kubeadm", "kubelet", "kubectl")
REPOSITORIES = {
    f"v1.{minor}": {
        **{package: [f"1.{minor}.{patch}-1.1" for patch in patches] for package in K8S},
        "kubernetes-cni": ["1.8.0-1.1"],
        "cri-tools": [f"1.{minor}.0-1.1"],
    }
    for minor, patches in ((34, (3, 0)), (35, (4, 2, 1, 0)), (36, (2, 1, 0)), (37, (0,)))
}


def write_prepare_step(node: UpgradeNode, cfg: LabConfig, lab_node: Node) -> Path:
    """The node's prepare bundle in its own step directory (/var/lib/labs-k8s/steps/<node>-prepare),
    where its step writes it and the upgrade steps find it again."""
    directory = node.root / STEP_ROOT.lstrip("/") / k8s.prepare_step_name(lab_node)
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in k8s.prepare_files(cfg, lab_node).items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o600)
    return directory


def run_prepare(node: UpgradeNode, cfg: LabConfig, lab_node: Node) -> subprocess.CompletedProcess[str]:
    """The node's prepare step as the graph runs it: its bundle written, then run from there."""
    write_prepare_step(node, cfg, lab_node)
    node.install_step(
        {
            "prepare.sh": f'exec bash "$LABS_K8S_ROOT{STEP_ROOT}/{k8s.prepare_step_name(lab_node)}/'
            f'{k8s.PREPARE_ENTRYPOINT}"\n'
        }
    )
    return node.run("prepare.sh")


def build_cluster(base: Path, version: str = OLD) -> FakeCluster:
    """Five prepared, joined nodes at `version`: prepare-node.sh runs for real on each, then what
    kubeadm init/join leave behind (FakeCluster.join)."""
    cluster = FakeCluster(base, version)
    cfg = make_lab_config(kubernetes={"version": version.removeprefix("v")})
    by_name = {node.name: node for node in cfg.kubernetes_nodes}
    for name, (ip, role, disk) in NODES.items():
        node = cluster.add_node(name, ip, role, REPOSITORIES)
        if node.missing_tools:
            raise RuntimeError(f"the shell harness needs {', '.join(node.missing_tools)} on PATH")
        fresh_debian_node(node, data_disk_gib=disk)
        prepared = run_prepare(node, cfg, by_name[name])
        if prepared.returncode != 0:
            raise RuntimeError(f"prepare-node.sh failed on {name}:\n{prepared.stderr}")
        cluster.join(name, version)
        (cluster.dir / "nodes" / name / "workloads").write_text(f"default   web-{name[-3:]}   1/1   Running\n")
    return cluster


# ------------------------------------------------------------------ the chain


@dataclass(frozen=True)
class Step:
    name: str
    host: str
    files: dict[str, str]
    entrypoint: str
    args: tuple[str, ...] = ()


def chain(cfg: LabConfig) -> list[Step]:
    """The steps of rendering.k8s.upgrade_order, in order, as the graph runs them."""
    first = cfg.control_planes[0].name
    steps: list[Step] = []
    for item in k8s.upgrade_order(cfg):
        name = item.node.name
        if item.kind in ("apply", "node"):
            steps.append(
                Step(
                    f"{name}-upgrade",
                    name,
                    k8s.upgrade_control_plane_files(cfg, item.node),
                    k8s.UPGRADE_CONTROL_PLANE_ENTRYPOINT,
                )
            )
        else:
            drain = k8s.upgrade_drain_files(cfg, item.node)
            steps += [
                Step(
                    f"{name}-upgrade-drain", first, drain, k8s.UPGRADE_DRAIN_ENTRYPOINT, k8s.upgrade_drain_args("drain")
                ),
                Step(f"{name}-upgrade", name, k8s.upgrade_worker_files(cfg, item.node), k8s.UPGRADE_WORKER_ENTRYPOINT),
                Step(
                    f"{name}-upgrade-uncordon",
                    first,
                    drain,
                    k8s.UPGRADE_DRAIN_ENTRYPOINT,
                    k8s.upgrade_drain_args("uncordon"),
                ),
            ]
    return steps


@dataclass
class ChainRun:
    results: dict[str, subprocess.CompletedProcess[str]]
    failed: str | None

    def stdout(self, step: str) -> str:
        return self.results[step].stdout

    def stderr(self, step: str) -> str:
        return self.results[step].stderr


def short_waits(files: dict[str, str], seconds: int = 15) -> dict[str, str]:
    """The same bundle with its waits bounded to `seconds` (the stand-in `sleep` returns at once)."""
    params = files[k8s.PARAMS_FILE]
    for name in ("NODE_WAIT_SECONDS", "VERIFY_TIMEOUT_SECONDS", "API_WAIT_SECONDS"):
        params = (
            "\n".join(f"{name}={seconds}" if line.startswith(f"{name}=") else line for line in params.splitlines())
            + "\n"
        )
    return {**files, k8s.PARAMS_FILE: params}


def run_chain(
    cluster: FakeCluster, cfg: LabConfig, start: str | None = None, waits: int | None = None, prepare: bool = False
) -> ChainRun:
    """The upgrade steps in order, from `start`. A fresh run (no `start`) first puts every node's
    prepare step of the new config in place, as the graph does before the chain; `prepare=True` also
    runs them (on a joined node at the old version they change nothing:
    test_preparing_a_running_node_for_a_new_version_changes_nothing), the others save the time."""
    steps = chain(cfg)
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    if start is not None:
        steps = steps[[s.name for s in steps].index(start) :]
    else:
        for lab_node in cfg.kubernetes_nodes:
            node = cluster.nodes[lab_node.name]
            if not prepare:
                write_prepare_step(node, cfg, lab_node)
                continue
            prepared = run_prepare(node, cfg, lab_node)
            results[k8s.prepare_step_name(lab_node)] = prepared
            if prepared.returncode != 0:
                return ChainRun(results, k8s.prepare_step_name(lab_node))
    for step in steps:
        node = cluster.nodes[step.host]
        node.install_step(short_waits(step.files, waits) if waits else step.files)
        results[step.name] = node.run(step.entrypoint, *step.args)
        if results[step.name].returncode != 0:
            return ChainRun(results, step.name)
    return ChainRun(results, None)


# The commands that make the procedure, as "<node>: <command>", in the order every node issued them.
def events(cluster: FakeCluster) -> list[str]:
    out: list[str] = []
    for node, command, *args in cluster.calls():
        words = [a for a in args if not a.startswith("-")]
        line = None
        if command == "apt-get" and words[:1] == ["update"]:
            line = "apt-get update"
        elif command == "apt-get" and words[:1] == ["install"]:
            line = "apt-get install " + " ".join(w for w in words[1:] if "::" not in w)
        elif command == "kubeadm" and words[:1] == ["upgrade"]:
            line = "kubeadm " + " ".join(args)
        elif command == "kubectl" and "snapshot" in args:
            line = "etcdctl snapshot save " + args[-1]
        elif command == "kubectl" and ("drain" in args or "uncordon" in args):
            verb = "drain" if "drain" in args else "uncordon"
            line = f"kubectl {verb} {args[args.index(verb) + 1]}"
        elif command == "systemctl" and args in (["daemon-reload"], ["restart", "kubelet"]):
            line = "systemctl " + " ".join(args)
        if line:
            out.append(f"{node.removeprefix('labs-k8s-')}: {line}")
    return out


def most_cordoned_at_once(cluster: FakeCluster) -> int:
    cordoned: set[str] = set()
    most = 0
    for event in events(cluster):
        verb, node = event.split()[-2:]
        if verb == "drain":
            cordoned.add(node)
        elif verb == "uncordon":
            cordoned.discard(node)
        most = max(most, len(cordoned))
    return most
