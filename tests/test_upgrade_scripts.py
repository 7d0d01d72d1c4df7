"""Kubernetes upgrades: the real upgrade scripts, node after node, against a cluster of stand-ins.

A session-wide template is a five-node kubeadm cluster at v1.35.2 (m01-m03, w01-w02): every node
prepared by the real prepare-node.sh and joined (tests/upgrade_harness.py). Each test copies it, sets
labs-k8s:kubernetes.version, and runs the chain the graph runs (rendering.k8s.upgrade_order): on each
control plane upgrade-control-plane.sh; for each worker upgrade-drain.sh drain on m01,
upgrade-worker.sh on the worker, upgrade-drain.sh uncordon on m01. A failed step stops the chain; the
next `pulumi up` re-runs the failed step and what follows, which `run_chain(start=...)` does too.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from components.config import LabConfig
from components.rendering import STEP_ROOT, k8s, step_bundle
from tests.labs import make_lab_config, make_lab_config_with
from tests.requirements import require_tool, unavailable
from tests.test_k8s_scripts import fresh_debian_node
from tests.upgrade_harness import (
    K8S,
    NODES,
    OLD,
    REPOSITORIES,
    ChainRun,
    FakeCluster,
    build_cluster,
    chain,
    events,
    most_cordoned_at_once,
    run_chain,
    run_prepare,
)

SNAPSHOT = "/var/lib/labs-k8s/etcd-snapshots/etcd-before-v1.36.0.db"
REPO = Path(__file__).resolve().parents[1]


def config(version: str, **upgrade: int) -> LabConfig:
    return make_lab_config(kubernetes={"version": version, "upgrade": upgrade} if upgrade else {"version": version})


# ------------------------------------------------------------------ the cluster


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five prepared, joined nodes at v1.35.2, built once (upgrade_harness.build_cluster)."""
    require_tool("bash", "openssl", "jq", "timeout")
    base = tmp_path_factory.mktemp("cluster-template")
    try:
        build_cluster(base)
    except RuntimeError as error:
        if "needs" in str(error):
            unavailable(str(error))
        raise
    return base


@pytest.fixture
def cluster(template: Path, tmp_path: Path) -> FakeCluster:
    base = tmp_path / "lab"
    copy = FakeCluster.copy(template, base)
    copy.reset_log()
    return copy


def ok(run: ChainRun) -> ChainRun:
    assert run.failed is None, f"{run.failed} failed:\n{run.stderr(run.failed)}"
    return run


def control_plane_events(node: str, mode: str, target: str, package: str) -> list[str]:
    first = [
        f"{node}: kubeadm upgrade plan {target}",
        f"{node}: etcdctl snapshot save /var/lib/etcd/labs-k8s-etcd-before-{target}.db",
        f"{node}: kubeadm upgrade apply {target} --yes",
    ]
    return [
        f"{node}: apt-get update",
        f"{node}: apt-get install kubeadm={package}",
        *(first if mode == "apply" else [f"{node}: kubeadm upgrade node"]),
        f"{node}: kubectl drain labs-k8s-{node}",
        f"{node}: apt-get install kubelet={package} kubectl={package}",
        f"{node}: systemctl daemon-reload",
        f"{node}: systemctl restart kubelet",
        f"{node}: kubectl uncordon labs-k8s-{node}",
    ]


def worker_events(node: str, package: str) -> list[str]:
    return [
        f"m01: kubectl drain labs-k8s-{node}",
        f"{node}: apt-get update",
        f"{node}: apt-get install kubeadm={package}",
        f"{node}: kubeadm upgrade node",
        f"{node}: apt-get install kubelet={package} kubectl={package}",
        f"{node}: systemctl daemon-reload",
        f"{node}: systemctl restart kubelet",
        f"m01: kubectl uncordon labs-k8s-{node}",
    ]


def assert_all_at(cluster: FakeCluster, version: str) -> None:
    assert cluster.version == version
    for name in NODES:
        assert cluster.kubelet(name) == version, name
        assert not cluster.cordoned(name), name
        assert cluster.annotations(name) == {}, name
        for package in K8S:
            assert (cluster.nodes[name].state / "dpkg" / package).read_text().startswith(version[1:] + "-"), package
    for name in NODES:
        if name.startswith("labs-k8s-m"):
            for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
                assert cluster.pod_image(f"{component}-{name}") == f"registry.k8s.io/{component}:{version}"


# ------------------------------------------------------------------ the procedure


def test_a_minor_upgrade_follows_kubeadms_procedure_node_by_node(cluster: FakeCluster) -> None:
    # The new minor's kubeadm pins another pause image: the node follows it while drained.
    for node in cluster.nodes.values():
        node.set_state("pause-36", "3.10.2")
    cfg = config("1.36.0")
    run = ok(run_chain(cluster, cfg, prepare=True))
    package = "1.36.0-1.1"
    assert events(cluster) == [
        *control_plane_events("m01", "apply", "v1.36.0", package),
        *control_plane_events("m02", "node", "v1.36.0", package),
        *control_plane_events("m03", "node", "v1.36.0", package),
        *worker_events("w01", package),
        *worker_events("w02", package),
    ]
    assert most_cordoned_at_once(cluster) == 1, "one node at a time, control planes and workers alike"
    assert_all_at(cluster, "v1.36.0")
    assert (cluster.dir / "addons").read_text().strip() == "v1.36.0"

    # The repository of the new minor, on every node; the packages held again; containerd's pause image
    # from the new kubeadm, containerd restarted while the node was cordoned.
    log = cluster.calls()
    for name, node in cluster.nodes.items():
        kubernetes_list = (node.root / "etc/apt/sources.list.d/kubernetes.list").read_text()
        assert "https://pkgs.k8s.io/core:/stable:/v1.36/deb/ /" in kubernetes_list
        assert set(K8S) <= set((node.state / "held").read_text().split()), name
        assert "sandbox = 'registry.k8s.io/pause:3.10.2'" in (node.root / "etc/containerd/config.toml").read_text()
        drain = next(i for i, c in enumerate(log) if c[1] == "kubectl" and "drain" in c and name in c)
        restart = next(i for i, c in enumerate(log) if c[0] == name and c[1:] == ["systemctl", "restart", "containerd"])
        uncordon = next(i for i, c in enumerate(log) if c[1] == "kubectl" and "uncordon" in c and name in c)
        assert drain < restart < uncordon, name

    # The etcd snapshot, taken on m01 before `upgrade apply`, reported on stdout and kept on the root disk.
    assert run.stdout("labs-k8s-m01-upgrade") == (
        f"labs-k8s-m01 upgraded to v1.36.0, containerd 2.2.1; etcd snapshot {SNAPSHOT}\n"
    )
    m01 = cluster.nodes["labs-k8s-m01"]
    snapshot = m01.root / SNAPSHOT.lstrip("/")
    assert snapshot.stat().st_size % 512 == 32 and oct(snapshot.stat().st_mode)[-3:] == "600"
    assert (snapshot.parent / "etcd-before-v1.36.0.db.sha256").read_text().split()[1] == snapshot.name
    assert not list((m01.root / "var/lib/etcd").glob("labs-k8s-*")), "the copy on the etcd disk is moved away"
    for step in ("labs-k8s-m02-upgrade", "labs-k8s-m03-upgrade"):
        assert run.stdout(step) == f"{step.removesuffix('-upgrade')} upgraded to v1.36.0, containerd 2.2.1\n"
    assert run.stdout("labs-k8s-w01-upgrade-drain") == "drained labs-k8s-w01\n"
    assert run.stdout("labs-k8s-w01-upgrade") == "labs-k8s-w01 upgraded to v1.36.0, containerd 2.2.1\n"
    assert run.stdout("labs-k8s-w01-upgrade-uncordon") == "uncordoned labs-k8s-w01\n"

    # kubeadm renewed admin.conf on every control plane; root's kubeconfig is the renewed one.
    for name in ("labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"):
        node = cluster.nodes[name]
        admin = (node.root / "etc/kubernetes/admin.conf").read_text()
        assert "client-certificate-data: renewed-" in admin
        assert (node.root / "root/.kube/config").read_text() == admin
    # Every node got the kubelet configuration of the new version from `kubeadm upgrade apply|node`.
    for name, node in cluster.nodes.items():
        assert "at v1.36.0" in (node.root / "var/lib/kubelet/config.yaml").read_text(), name
    # No cluster-admin credentials on a worker: it reads with its own kubelet.conf and nothing else.
    for name in ("labs-k8s-w01", "labs-k8s-w02"):
        calls = cluster.nodes[name].calls("kubectl")
        assert calls and all(
            c[1:3] == ["--kubeconfig", str(cluster.nodes[name].root / "etc/kubernetes/kubelet.conf")] for c in calls
        )
        assert not (cluster.nodes[name].root / "etc/kubernetes/admin.conf").exists()

    # The same version again: every step finds its node done and changes nothing.
    after = cluster.snapshot()
    cluster.reset_log()
    again = ok(run_chain(cluster, cfg))
    assert cluster.snapshot() == after
    assert events(cluster) == []
    assert {again.stdout(s) for s in again.results if s.endswith("-upgrade")} == {
        f"{name} already at v1.36.0, containerd 2.2.1\n" for name in NODES
    }
    for name in NODES:
        calls = cluster.nodes[name].calls()
        assert not [c for c in calls if c[0] in ("apt-get", "apt-mark") and c[1] != "showhold"], name
        assert not [c for c in calls if c[0] == "kubectl" and {"annotate", "drain", "uncordon"} & set(c)], name


MIRROR = "https://nexus.lab.local/repository/k8s-stable"


def test_a_minor_upgrade_takes_the_next_minor_from_the_configured_repository(cluster: FakeCluster) -> None:
    """The cluster was made from pkgs.k8s.io; the site now has a mirror (labs-k8s:mirrors.kubernetesRepository.url)
    and upgrades in the same `pulumi up`: the prepare steps leave the running nodes' repository alone, and
    each node's upgrade step switches it to the mirror's repository of the new minor, drained, in order."""
    cfg = make_lab_config(kubernetes={"version": "1.36.0"}, mirrors={"kubernetesRepository": {"url": MIRROR + "/"}})
    ok(run_chain(cluster, cfg, prepare=True))
    assert_all_at(cluster, "v1.36.0")
    for name, node in cluster.nodes.items():
        kubernetes_list = (node.root / "etc/apt/sources.list.d/kubernetes.list").read_text()
        assert f"] {MIRROR}/v1.36/deb/ /\n" in kubernetes_list, name
        assert "pkgs.k8s.io" not in kubernetes_list, name
        assert node.calls_matching("curl", f"{MIRROR}/v1.35/deb/Release.key"), name  # the prepare step's key check


def test_a_release_the_configured_repository_lacks_is_named_with_it(cluster: FakeCluster) -> None:
    cfg = make_lab_config(kubernetes={"version": "1.36.7"}, mirrors={"kubernetesRepository": {"url": MIRROR}})
    run = run_chain(cluster, cfg)
    assert run.failed == "labs-k8s-m01-upgrade", run.failed
    assert (
        f"the Kubernetes repository {MIRROR}/v1.36/deb/ (labs-k8s:mirrors.kubernetesRepository.url) "
        "has no kubeadm 1.36.7"
    ) in run.stderr("labs-k8s-m01-upgrade")


def test_a_patch_upgrade_keeps_the_repository_and_still_drains(cluster: FakeCluster) -> None:
    def lists() -> dict[str, bytes]:
        return {
            name: (node.root / "etc/apt/sources.list.d/kubernetes.list").read_bytes()
            for name, node in cluster.nodes.items()
        }

    before = lists()
    run = ok(run_chain(cluster, config("1.35.4")))
    package = "1.35.4-1.1"
    assert events(cluster) == [
        # The same repository; `apt-get update` still runs, or the new patch is not in the index.
        *control_plane_events("m01", "apply", "v1.35.4", package),
        *control_plane_events("m02", "node", "v1.35.4", package),
        *control_plane_events("m03", "node", "v1.35.4", package),
        *worker_events("w01", package),
        *worker_events("w02", package),
    ]
    assert_all_at(cluster, "v1.35.4")
    assert lists() == before
    snapshot = "/var/lib/labs-k8s/etcd-snapshots/etcd-before-v1.35.4.db"
    assert run.stdout("labs-k8s-m01-upgrade") == (
        f"labs-k8s-m01 upgraded to v1.35.4, containerd 2.2.1; etcd snapshot {snapshot}\n"
    )


def test_preparing_a_running_node_for_a_new_version_changes_nothing(cluster: FakeCluster) -> None:
    """Every prepare step runs first when the version changes (its params carry it): on a node in the
    cluster at the old version it installs and restarts nothing; the upgrade steps do, in order."""
    cfg = config("1.36.0")
    before = cluster.snapshot()
    for lab_node in cfg.kubernetes_nodes:
        result = run_prepare(cluster.nodes[lab_node.name], cfg, lab_node)
        assert result.returncode == 0, result.stderr
        assert "runs kubelet 1.35.2 in the cluster; labs-k8s:kubernetes.version 1.36.0" in result.stderr
    assert cluster.snapshot() == before
    for name, node in cluster.nodes.items():
        assert node.calls_matching("apt-get", "install") == [], name
        assert node.calls_matching("systemctl", "restart") == [], name


def test_the_configured_version_changes_nothing(cluster: FakeCluster) -> None:
    """What every upgrade step does when the lab is created, or when the version did not change."""
    before = cluster.snapshot()
    run = ok(run_chain(cluster, config(OLD.removeprefix("v"))))
    assert cluster.snapshot() == before
    assert events(cluster) == []
    assert run.stdout("labs-k8s-m01-upgrade") == "labs-k8s-m01 already at v1.35.2, containerd 2.2.1\n"
    assert run.stdout("labs-k8s-w01-upgrade-drain") == "labs-k8s-w01 already at v1.35.2\n"
    assert run.stdout("labs-k8s-w01-upgrade") == "labs-k8s-w01 already at v1.35.2, containerd 2.2.1\n"
    assert run.stdout("labs-k8s-w01-upgrade-uncordon") == "labs-k8s-w01 already at v1.35.2\n"


def runtime_events(cluster: FakeCluster) -> list[str]:
    """What a containerd roll does, as "<node>: <command>": drains, installs, restarts, uncordons."""
    out = []
    for node, command, *args in cluster.calls():
        words = [a for a in args if not a.startswith("-")]
        if command == "kubectl" and ("drain" in args or "uncordon" in args):
            verb = "drain" if "drain" in args else "uncordon"
            out.append(f"kubectl {verb} {args[args.index(verb) + 1]}")
        elif command == "apt-get" and words[:1] == ["install"]:
            out.append("apt-get install " + " ".join(w for w in words[1:] if "::" not in w))
        elif command == "systemctl" and args[:1] == ["restart"]:
            out.append("systemctl " + " ".join(args))
        elif command == "kubeadm" and words[:1] == ["upgrade"]:
            out.append("kubeadm " + " ".join(args))
        else:
            continue
        out[-1] = f"{node.removeprefix('labs-k8s-')}: {out[-1]}"
    return out


def test_a_containerd_change_is_rolled_node_by_node_drained(cluster: FakeCluster) -> None:
    """labs-k8s:kubernetes.containerdVersion alone: the prepare steps (every node at once) leave the
    runtime of a joined node alone; the upgrade chain installs it, one node drained at a time."""
    cfg = make_lab_config(kubernetes={"version": OLD.removeprefix("v"), "containerdVersion": "2.1.5"})
    run = ok(run_chain(cluster, cfg, prepare=True))
    for lab_node in cfg.kubernetes_nodes:
        assert "containerdVersion 2.1.5 comes with its upgrade step, drained" in run.stderr(
            k8s.prepare_step_name(lab_node)
        )
    package = "2.1.5-1~debian.12~bookworm"

    def control_plane(node: str) -> list[str]:
        return [
            f"{node}: kubectl drain labs-k8s-{node}",
            f"{node}: apt-get install containerd.io={package}",
            f"{node}: systemctl restart containerd",
            f"{node}: systemctl restart kubelet",
            f"{node}: kubectl uncordon labs-k8s-{node}",
        ]

    def worker(node: str) -> list[str]:
        return [
            f"m01: kubectl drain labs-k8s-{node}",
            f"{node}: apt-get install containerd.io={package}",
            f"{node}: systemctl restart containerd",
            f"{node}: systemctl restart kubelet",
            f"m01: kubectl uncordon labs-k8s-{node}",
        ]

    assert runtime_events(cluster) == [
        *control_plane("m01"),
        *control_plane("m02"),
        *control_plane("m03"),
        *worker("w01"),
        *worker("w02"),
    ], "no kubeadm upgrade, one node at a time"
    assert most_cordoned_at_once(cluster) == 1
    for name in NODES:
        assert (cluster.nodes[name].state / "dpkg/containerd.io").read_text() == package, name
        assert cluster.node_file(name, "runtime").read_text().strip() == "containerd://2.1.5", name
        assert run.stdout(f"{name}-upgrade") == f"{name} upgraded to {OLD}, containerd 2.1.5\n"
    assert_all_at(cluster, OLD)

    # The same pin again: nothing is drained, installed or restarted.
    after = cluster.snapshot()
    cluster.reset_log()
    again = ok(run_chain(cluster, cfg, prepare=True))
    assert runtime_events(cluster) == []
    assert cluster.snapshot() == after
    assert {again.stdout(s) for s in again.results if s.endswith("-upgrade")} == {
        f"{name} already at {OLD}, containerd 2.1.5\n" for name in NODES
    }


def test_workers_at_once_makes_lanes() -> None:
    def lab(workers: int, at_once: int) -> LabConfig:
        def grow(raw: dict) -> None:
            raw["nodes"]["workers"]["hosts"] = [
                {"name": f"labs-k8s-w{i:02}", "ip": f"10.3.60.{60 + i}"} for i in range(1, workers + 1)
            ]
            raw["kubernetes"]["upgrade"] = {"workersAtOnce": at_once}

        return make_lab_config_with(grow)

    assert [(s.node.name, s.kind, s.after) for s in k8s.upgrade_order(config("1.36.0"))] == [
        ("labs-k8s-m01", "apply", ()),
        ("labs-k8s-m02", "node", ("labs-k8s-m01",)),
        ("labs-k8s-m03", "node", ("labs-k8s-m02",)),
        ("labs-k8s-w01", "worker", ("labs-k8s-m03",)),
        ("labs-k8s-w02", "worker", ("labs-k8s-w01",)),
    ]
    order = {s.node.name: s.after for s in k8s.upgrade_order(lab(5, 2)) if s.kind == "worker"}
    assert order == {
        "labs-k8s-w01": ("labs-k8s-m03",),
        "labs-k8s-w02": ("labs-k8s-m03",),
        "labs-k8s-w03": ("labs-k8s-w01",),
        "labs-k8s-w04": ("labs-k8s-w02",),
        "labs-k8s-w05": ("labs-k8s-w03",),
    }


def test_the_runbooks_figures_are_the_benchs(cluster: FakeCluster) -> None:
    """docs/runbook.md "Upgrading Kubernetes" quotes bench/upgrade_chain.py: the serialized steps and
    the waves of the program's change plan, the estimated work and drain windows of the real scripts."""
    spec = importlib.util.spec_from_file_location("upgrade_chain_bench", REPO / "bench" / "upgrade_chain.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    assert f"v{bench.BEFORE}" == OLD, "the bench starts where the stand-in cluster is"
    graph = bench.graph_figures()
    scripts = bench.script_figures(cluster)
    assert [name for _, names in graph.chain for name in names] == [s.name for s in chain(config(bench.AFTER))]
    assert sorted(node for node, _, _ in scripts.drained) == sorted(NODES)
    control_planes = {f"{seconds / 60:.1f}" for node, seconds, _ in scripts.drained if "-m" in node}
    workers = {f"{seconds / 60:.1f}" for node, seconds, _ in scripts.drained if "-w" in node}
    assert len(control_planes) == len(workers) == 1, scripts.drained
    assert scripts.most_drained_at_once == 1

    text = " ".join((REPO / "docs" / "runbook.md").read_text().split())
    quoted = re.search(
        r"the upgrade is (\d+) serialized steps \(3 control planes, 3 per worker\) inside the (\d+) waves of "
        r"`pulumi up`; about (\d+) minutes of serialized work, of which each control plane is drained about "
        r"([\d.]+) minutes and each worker about ([\d.]+) minutes, never two nodes at once",
        text,
    )
    assert quoted, "the runbook's figures sentence is gone"
    assert quoted.groups() == (
        str(sum(len(names) for _, names in graph.chain)),
        str(graph.waves),
        f"{scripts.total_seconds / 60:.0f}",
        control_planes.pop(),
        workers.pop(),
    ), "run `make bench` and copy its figures into docs/runbook.md"


def test_a_node_added_after_an_upgrade_installs_the_new_version_directly(cluster: FakeCluster) -> None:
    """A worker appended to labs-k8s:nodes.workers.hosts once the cluster runs v1.36.0: its prepare step
    installs 1.36.0 from the v1.36 repository (no detour through the old version), and its upgrade
    steps, once it joined, find it done."""
    ok(run_chain(cluster, config("1.36.0")))

    def add_w03(raw: dict) -> None:
        raw["kubernetes"]["version"] = "1.36.0"
        raw["nodes"]["workers"]["hosts"].append({"name": "labs-k8s-w03", "ip": "10.3.60.57"})

    lab = make_lab_config_with(add_w03)
    w03 = cluster.add_node("labs-k8s-w03", "10.3.60.57", "worker", REPOSITORIES)
    fresh_debian_node(w03)
    lab_node = next(n for n in lab.workers if n.name == "labs-k8s-w03")
    prepared = run_prepare(w03, lab, lab_node)
    assert prepared.returncode == 0, prepared.stderr
    for package in K8S:
        assert (w03.state / "dpkg" / package).read_text().startswith("1.36.0-"), package
    assert (
        "https://pkgs.k8s.io/core:/stable:/v1.36/deb/ /"
        in (w03.root / "etc/apt/sources.list.d/kubernetes.list").read_text()
    )
    installs = [c for c in w03.calls("apt-get") if "install" in c]
    assert not [c for c in installs if any(a.startswith(("kubeadm=1.35", "kubelet=1.35", "kubectl=1.35")) for a in c)]

    cluster.join("labs-k8s-w03", "v1.36.0")
    cluster.reset_log()
    run = ok(run_chain(cluster, lab, start="labs-k8s-w03-upgrade-drain"))
    assert run.stdout("labs-k8s-w03-upgrade") == "labs-k8s-w03 already at v1.36.0, containerd 2.2.1\n"
    assert events(cluster) == []


# ------------------------------------------------------------------ resuming


def test_a_control_plane_that_fails_stops_the_chain_and_the_next_run_resumes_there(cluster: FakeCluster) -> None:
    cfg = config("1.36.0")
    m02 = cluster.nodes["labs-k8s-m02"]
    m02.set_state("kubeadm-fail-component", "kube-scheduler")
    run = run_chain(cluster, cfg)
    assert run.failed == "labs-k8s-m02-upgrade"
    assert "kubeadm upgrade node failed" in run.stderr(run.failed)
    assert "timed out waiting for the condition" in run.stderr(run.failed)
    # m01 is done; kubeadm rolled m02's manifests back; nothing after m02 ran; m02 was never drained.
    assert cluster.version == "v1.36.0" and cluster.kubelet("labs-k8s-m01") == "v1.36.0"
    assert cluster.pod_image("kube-apiserver-labs-k8s-m02") == f"registry.k8s.io/kube-apiserver:{OLD}"
    manifest = (m02.root / "etc/kubernetes/manifests/kube-apiserver.yaml").read_text()
    assert "registry.k8s.io/kube-apiserver:v1.35.2" in manifest
    assert not cluster.cordoned("labs-k8s-m02")
    assert [e for e in events(cluster) if e.startswith(("m03", "w01", "w02"))] == []
    assert cluster.kubelet("labs-k8s-w01") == OLD

    # Hours later: the cause is gone, `pulumi up` re-runs m02's step and everything after it.
    m02.clear_state("kubeadm-fail-component")
    cluster.reset_log()
    ok(run_chain(cluster, cfg, start="labs-k8s-m02-upgrade"))
    assert events(cluster)[:2] == ["m02: kubeadm upgrade node", "m02: kubectl drain labs-k8s-m02"], (
        "kubeadm is already at 1.36.0 on m02: no second install"
    )
    assert_all_at(cluster, "v1.36.0")


def test_an_apply_killed_half_way_is_finished_with_the_same_snapshot(cluster: FakeCluster) -> None:
    cfg = config("1.36.0")
    m01 = cluster.nodes["labs-k8s-m01"]
    m01.set_state("kubeadm-crash-after", "control-plane")
    run = run_chain(cluster, cfg)
    assert run.failed == "labs-k8s-m01-upgrade"
    # What kubeadm leaves: m01's control plane at v1.36.0, kubeadm-config still at v1.35.2.
    assert cluster.pod_image("kube-apiserver-labs-k8s-m01") == "registry.k8s.io/kube-apiserver:v1.36.0"
    assert cluster.version == OLD
    snapshot = m01.root / SNAPSHOT.lstrip("/")
    first_snapshot = snapshot.read_bytes()

    m01.clear_state("kubeadm-crash-after")
    cluster.reset_log()
    run = ok(run_chain(cluster, cfg))
    m01_events = [e for e in events(cluster) if e.startswith("m01:")]
    assert "m01: kubeadm upgrade apply v1.36.0 --yes" in m01_events
    assert not any("snapshot" in e for e in m01_events), "the snapshot from before the first attempt is kept"
    assert snapshot.read_bytes() == first_snapshot
    assert f"etcd snapshot {SNAPSHOT}" in run.stdout("labs-k8s-m01-upgrade")
    assert_all_at(cluster, "v1.36.0")


def test_a_worker_whose_drain_is_blocked_stays_cordoned_and_is_finished_later(cluster: FakeCluster) -> None:
    cfg = config("1.36.0")
    cluster.set_node("labs-k8s-w01", "pdb-blocks", "")
    cluster.set_node("labs-k8s-w02", "unschedulable", "")  # an operator's cordon, kept through the upgrade
    run = run_chain(cluster, cfg)
    assert run.failed == "labs-k8s-w01-upgrade-drain"
    message = run.stderr(run.failed)
    assert "could not drain labs-k8s-w01" in message and "PodDisruptionBudget" in message
    assert "default   web-w01" in message, "the pods still on the node are listed"
    assert "kubectl drain labs-k8s-w01 --ignore-daemonsets --delete-emptydir-data --force" in message
    # Cordoned and marked, not upgraded; its packages untouched.
    assert cluster.cordoned("labs-k8s-w01")
    assert cluster.annotations("labs-k8s-w01") == {"labs-k8s/cordoned-for-upgrade": "v1.36.0"}
    assert cluster.kubelet("labs-k8s-w01") == OLD
    assert [e for e in events(cluster) if e.startswith(("w01", "w02"))] == []

    cluster.set_node("labs-k8s-w01", "pdb-blocks", None)
    cluster.reset_log()
    run = ok(run_chain(cluster, cfg, start="labs-k8s-w01-upgrade-drain"))
    assert events(cluster) == [*worker_events("w01", "1.36.0-1.1"), *worker_events("w02", "1.36.0-1.1")[:-1]]
    assert run.stdout("labs-k8s-w02-upgrade-uncordon") == "labs-k8s-w02 left cordoned\n"
    assert cluster.cordoned("labs-k8s-w02") and cluster.annotations("labs-k8s-w02") == {}
    cluster.set_node("labs-k8s-w02", "unschedulable", None)
    assert_all_at(cluster, "v1.36.0")


def test_a_kubelet_that_does_not_come_back_stops_before_the_uncordon(cluster: FakeCluster) -> None:
    cfg = config("1.36.0")
    w02 = cluster.nodes["labs-k8s-w02"]
    w02.set_state("kubelet-broken")
    run = run_chain(cluster, cfg, waits=15)
    assert run.failed == "labs-k8s-w02-upgrade"
    assert "node labs-k8s-w02 did not come back Ready at v1.36.0" in run.stderr(run.failed)
    assert cluster.cordoned("labs-k8s-w02")

    # The uncordon step would not have let it back either.
    w02_uncordon = chain(cfg)[-1]
    m01 = cluster.nodes["labs-k8s-m01"]
    m01.install_step(w02_uncordon.files)
    refused = m01.run(w02_uncordon.entrypoint, *w02_uncordon.args)
    assert refused.returncode != 0 and "not uncordoning labs-k8s-w02" in refused.stderr
    assert cluster.cordoned("labs-k8s-w02")

    w02.clear_state("kubelet-broken")
    ok(run_chain(cluster, cfg, start="labs-k8s-w02-upgrade"))
    assert_all_at(cluster, "v1.36.0")


def test_the_cluster_is_checked_after_each_control_plane(cluster: FakeCluster) -> None:
    """An etcd member that does not come back after m01's upgrade stops the chain at m01."""
    (cluster.dir / "etcd" / "10.3.60.53").write_text("false\n")
    run = run_chain(cluster, config("1.36.0"), waits=15)
    assert run.failed == "labs-k8s-m01-upgrade"
    message = run.stderr(run.failed)
    assert "etcd endpoints not healthy: https://10.3.60.53:2379" in message
    assert "the upgrade stops here" in message
    assert not [e for e in events(cluster) if not e.startswith("m01:")]

    (cluster.dir / "etcd" / "10.3.60.53").write_text("true\n")
    cluster.reset_log()
    run = ok(run_chain(cluster, config("1.36.0"), start="labs-k8s-m01-upgrade"))
    # m01 was done: its step finds it so; the next control plane's check covers the cluster again.
    assert run.stdout("labs-k8s-m01-upgrade") == "labs-k8s-m01 already at v1.36.0, containerd 2.2.1\n"
    assert [e for e in events(cluster) if e.startswith("m01:") and "labs-k8s-w0" not in e] == []
    assert_all_at(cluster, "v1.36.0")


# ------------------------------------------------------------------ refused before anything changes


def _refused(cluster: FakeCluster, version: str, step: str = "labs-k8s-m01-upgrade") -> str:
    before = cluster.snapshot()
    run = run_chain(cluster, config(version))
    assert run.failed == step, run.failed
    assert cluster.snapshot() == before, "nothing changed, on any node or in the cluster"
    touched = [e for e in events(cluster) if "install" in e or "kubeadm upgrade" in e or "drain" in e]
    assert touched == []
    return run.stderr(step)


def test_a_skipped_minor_is_refused(cluster: FakeCluster) -> None:
    message = _refused(cluster, "1.37.0")
    assert "labs-k8s:kubernetes.version 1.37.0 skips a minor: the cluster runs v1.35.2" in message
    assert "Set labs-k8s:kubernetes.version to a 1.36.x release" in message


@pytest.mark.parametrize("version", ["1.35.0", "1.34.3"])
def test_a_downgrade_is_refused(cluster: FakeCluster, version: str) -> None:
    message = _refused(cluster, version)
    assert f"labs-k8s:kubernetes.version is {version} but the cluster already runs v1.35.2" in message
    assert "downgrades are not supported" in message


def test_a_runtime_the_new_minor_does_not_support_is_refused(cluster: FakeCluster) -> None:
    cluster.set_node("labs-k8s-w02", "runtime", "containerd://1.7.28")
    message = _refused(cluster, "1.36.0")
    assert "node labs-k8s-w02 runs containerd 1.7.28; Kubernetes 1.36 needs containerd 2.0 or newer" in message
    assert "labs-k8s:kubernetes.containerdVersion" in message
    assert "labs-k8s:kubernetes.version 1.36.0" in message


def test_an_unhealthy_node_or_an_unfinished_earlier_upgrade_is_refused(cluster: FakeCluster) -> None:
    cluster.set_node("labs-k8s-w01", "ready", "False")
    (cluster.dir / "pods/kube-apiserver-labs-k8s-m03/image").write_text("registry.k8s.io/kube-apiserver:v1.34.3\n")
    message = _refused(cluster, "1.36.0")
    assert "node labs-k8s-w01 is not Ready (Ready=False)" in message
    assert "kube-apiserver-labs-k8s-m03 runs v1.34.3: the upgrade to v1.35.2 did not finish on its node" in message
    assert "2 problem(s) above" in message


def test_later_steps_refuse_to_run_out_of_order(cluster: FakeCluster) -> None:
    cfg = config("1.36.0")
    steps = {s.name: s for s in chain(cfg)}
    before = cluster.snapshot()
    for name, message in (
        ("labs-k8s-m02-upgrade", "the first control plane's upgrade step (kubeadm upgrade apply v1.36.0) must succeed"),
        ("labs-k8s-w01-upgrade-drain", "the control planes are upgraded before any worker is drained"),
        ("labs-k8s-w01-upgrade", "the control planes' upgrade steps must succeed before any worker"),
    ):
        step = steps[name]
        node = cluster.nodes[step.host]
        node.install_step(step.files)
        result = node.run(step.entrypoint, *step.args)
        assert result.returncode != 0 and message in result.stderr, (name, result.stderr)
    assert cluster.snapshot() == before
    # A worker that was not drained is not touched, even once the control planes are done.
    (cluster.dir / "version").write_text("v1.36.0\n")
    w01 = cluster.nodes["labs-k8s-w01"]
    w01.install_step(steps["labs-k8s-w01-upgrade"].files)
    result = w01.run(k8s.UPGRADE_WORKER_ENTRYPOINT)
    assert result.returncode != 0 and "labs-k8s-w01 is not cordoned" in result.stderr
    assert cluster.kubelet("labs-k8s-w01") == OLD
    assert [e for e in events(cluster) if e.startswith("w01")] == []


def test_a_component_config_kubeadm_cannot_convert_stops_before_the_snapshot(cluster: FakeCluster) -> None:
    cluster.nodes["labs-k8s-m01"].set_state("kubeadm-manual-config")
    run = run_chain(cluster, config("1.36.0"))
    assert run.failed == "labs-k8s-m01-upgrade"
    assert "kubeproxy.config.k8s.io need a manual upgrade" in run.stderr(run.failed)
    assert not any("snapshot" in e or "upgrade apply" in e for e in events(cluster))
    assert cluster.version == OLD


def test_a_failed_etcd_snapshot_stops_before_apply(cluster: FakeCluster) -> None:
    m01 = cluster.nodes["labs-k8s-m01"]
    m01.set_state("etcd-snapshot-fails")
    run = run_chain(cluster, config("1.36.0"))
    assert run.failed == "labs-k8s-m01-upgrade"
    assert "not upgrading without a backup of etcd" in run.stderr(run.failed)
    assert not any("upgrade apply" in e for e in events(cluster))
    assert not list((m01.root / "var/lib/etcd").glob("labs-k8s-*")), "no partial snapshot is left behind"
    assert not (m01.root / SNAPSHOT.lstrip("/")).exists()
    assert cluster.version == OLD


# ------------------------------------------------------------------ the bundles


def test_upgrade_bundles_are_valid_bash_and_carry_prepare_for_the_node() -> None:
    require_tool("bash")
    cfg = config("1.36.0")
    for step in chain(cfg):
        bundle = step_bundle(step.name, step.files, step.entrypoint, step.args)
        result = subprocess.run(["bash", "-n"], input=bundle, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        if step.entrypoint != k8s.UPGRADE_DRAIN_ENTRYPOINT:
            # The node's preparation is not in the bundle (a change of it alone must not re-run the
            # upgrade steps): the step runs the prepare step's own copy, from its directory.
            assert k8s.PREPARE_ENTRYPOINT not in step.files
            assert f"\nPREPARE_DIR={STEP_ROOT}/{step.host}-prepare\n" in step.files[k8s.PARAMS_FILE]
    params = k8s.upgrade_control_plane_files(cfg, cfg.control_planes[0])[k8s.PARAMS_FILE]
    for line in ("UPGRADE_MODE=apply", "K8S_VERSION=1.36.0", "K8S_MINOR_VERSION=1.36", "CONTAINERD_MIN_VERSION=2.0"):
        assert f"\n{line}\n" in params
    assert "UPGRADE_MODE=node\n" in k8s.upgrade_control_plane_files(cfg, cfg.control_planes[2])[k8s.PARAMS_FILE]
    with pytest.raises(ValueError, match="for a control-plane node"):
        k8s.upgrade_control_plane_files(cfg, cfg.workers[0])
    with pytest.raises(ValueError, match="for a worker node"):
        k8s.upgrade_worker_files(cfg, cfg.control_planes[1])
    with pytest.raises(ValueError, match="drain or uncordon"):
        k8s.upgrade_drain_args("evict")  # type: ignore[arg-type]


def test_the_stand_ins_refuse_what_the_real_tools_refuse(cluster: FakeCluster) -> None:
    """The procedure depends on these; a stand-in that accepted them would prove nothing."""
    m01 = cluster.nodes["labs-k8s-m01"]
    w01 = cluster.nodes["labs-k8s-w01"]
    m01.install_step({"probe.sh": '#!/usr/bin/env bash\n"$@"\n'})
    w01.install_step({"probe.sh": '#!/usr/bin/env bash\n"$@"\n'})
    admin = str(m01.root / "etc/kubernetes/admin.conf")
    cases = [
        # apt: a held package changes only with --allow-change-held-packages; the new minor needs an update.
        (m01, ["apt-get", "install", "-y", "kubeadm=1.35.1-1.1"], "Held packages were changed"),
        (
            m01,
            ["apt-get", "install", "-y", "--allow-change-held-packages", "kubeadm=1.36.0-1.1"],
            "Version '1.36.0-1.1' for 'kubeadm' was not found",
        ),
        # kubeadm: one minor at a time, never above its own minor, never without --yes.
        (
            m01,
            ["kubeadm", "upgrade", "apply", "v1.36.0", "--yes"],
            "is at least one minor release higher than the kubeadm",
        ),
        (m01, ["kubeadm", "upgrade", "apply", "v1.35.2"], "won't proceed"),
        # kubectl with a node's credentials cannot drain; etcdctl takes one endpoint for a snapshot.
        (
            w01,
            ["kubectl", "--kubeconfig", str(w01.root / "etc/kubernetes/kubelet.conf"), "drain", "labs-k8s-w01"],
            "Forbidden",
        ),
        (
            m01,
            [
                "kubectl",
                "--kubeconfig",
                admin,
                "-n",
                "kube-system",
                "exec",
                "etcd-labs-k8s-m01",
                "-c",
                "etcd",
                "--",
                "etcdctl",
                "--endpoints=https://10.3.60.51:2379,https://10.3.60.52:2379",
                "snapshot",
                "save",
                "/var/lib/etcd/x.db",
            ],
            "snapshot must be requested to one selected node",
        ),
        (m01, ["kubectl", "--kubeconfig", admin, "annotate", "node", "labs-k8s-w01", "a=1"], ""),
        (m01, ["kubectl", "--kubeconfig", admin, "annotate", "node", "labs-k8s-w01", "a=2"], "--overwrite is false"),
    ]
    for node, command, message in cases:
        result = node.run("probe.sh", *command)
        if message:
            assert result.returncode != 0 and message in result.stderr, (command, result.stderr)
        else:
            assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", ["kubeadm", "kubectl", "apt-get", "apt-cache", "apt-mark", "systemctl"])
def test_the_stand_ins_are_clean_bash(cluster: FakeCluster, command: str) -> None:
    """As written on PATH (prelude and pieces from tests/standins), every stand-in passes shellcheck."""
    require_tool("shellcheck")
    stub = cluster.nodes["labs-k8s-m01"].bin / command
    result = subprocess.run(["shellcheck", "-s", "bash", str(stub)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout
