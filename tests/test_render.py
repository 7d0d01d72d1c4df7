"""`python -m components render`: offline plan, graph and every file pushed to a machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.tools.artifacts import PLACEHOLDERS
from components.tools.offline import PLACEHOLDER_PRIVATE_KEY, PLACEHOLDER_SECRET, REPO_ROOT
from components.tools.render import graph_depth, mermaid_graph, plan_document

HOSTS = [
    "labs-k8s-lb01",
    "labs-k8s-lb02",
    "labs-k8s-m01",
    "labs-k8s-m02",
    "labs-k8s-m03",
    "labs-k8s-w01",
    "labs-k8s-w02",
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("render")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    # No proxy: nothing in render may reach for the network.
    env.update(http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", no_proxy="")
    result = subprocess.run(
        [sys.executable, "-m", "components", "render", "--stack", "labs", "--out", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "rendered" in result.stdout
    return out


def test_plan_lists_every_resource_with_parent_and_dependencies(rendered, offline_run):
    plan = json.loads((rendered / "plan.json").read_text())
    assert len(plan) == len(offline_run.registrations)
    by_name = {entry["name"]: entry for entry in plan}
    join = by_name["labs-k8s-m03-kubeadm-join"]
    assert join["type"] == "command:remote:Command"
    assert join["parent"] == "cluster"
    assert "labs-k8s-m03-refresh-join-material" in join["dependsOn"]
    assert by_name["labs-k8s-m01"]["inputs"]["scsiType"] == "pvscsi"
    assert plan == json.loads(json.dumps(plan_document(offline_run), sort_keys=True))


def test_plan_hides_every_secret(rendered):
    text = (rendered / "plan.json").read_text()
    plan = json.loads(text)
    by_name = {entry["name"]: entry for entry in plan}
    assert "password" not in by_name["golden-template"]["inputs"]
    assert by_name["labs-k8s-m01-kubeadm-init"]["inputs"]["stdin"] == "[secret]"
    assert by_name["labs-k8s-w01-ready"]["inputs"]["connection"] == "[secret]"
    for leaked in (PLACEHOLDER_SECRET, "PRIVATE KEY", PLACEHOLDER_PRIVATE_KEY.splitlines()[1]):
        assert leaked not in text
    outputs = json.loads((rendered / "outputs.json").read_text())
    assert outputs["kubeconfig"] == "[secret]"


def test_graph_is_mermaid_grouped_by_component(rendered, offline_run):
    graph = (rendered / "graph.mmd").read_text()
    assert graph.startswith("flowchart LR\n")
    for component in ("template", "fleet", "balancers", "cluster"):
        assert f'subgraph {component}_group["{component} (labs-k8s:' in graph
    assert "labs_k8s_m02_kubeadm_join --> labs_k8s_m03_refresh_join_material" in graph
    assert graph == mermaid_graph(offline_run)
    assert graph_depth(offline_run) >= 8


def test_every_host_has_its_files(rendered):
    hosts = rendered / "hosts"
    assert sorted(p.name for p in hosts.iterdir()) == sorted([*HOSTS, "golden-template", "cluster-endpoint"])
    for host in HOSTS:
        assert (hosts / host / "cloud-init" / "user-data.yaml").read_text().startswith("#cloud-config")
        assert "local-hostname: " + host in (hosts / host / "cloud-init" / "meta-data.yaml").read_text()
    for balancer in HOSTS[:2]:
        assert "bind 10.3.60.100:6443" in (hosts / balancer / "steps/lb-setup/haproxy.cfg").read_text()
        assert (hosts / balancer / "steps/lb-setup/keepalived.conf").is_file()
    m01 = hosts / "labs-k8s-m01" / "steps"
    assert 'controlPlaneEndpoint: "10.3.60.100:6443"' in (m01 / "kubeadm-init/kubeadm-init.yaml").read_text()
    assert (m01 / "kubeadm-join/kubeadm-join.yaml").is_file()  # every control plane joins, m01 too
    cluster = hosts / "cluster-endpoint" / "steps"  # whichever control plane the VIP's SSH port reaches
    assert (cluster / "flannel/kube-flannel.yml").is_file()
    assert (cluster / "labs-k8s-m03-leave-cluster/leave-cluster.sh").is_file()
    assert "JOINING_NODE=labs-k8s-w01" in (cluster / "labs-k8s-w01-refresh-join-material/params.env").read_text()
    assert (hosts / "labs-k8s-w02/steps/kubeadm-join/kubeadm-join.yaml").is_file()
    assert (hosts / "golden-template/preseed.cfg").is_file()


def test_generated_secrets_are_marked_placeholders(rendered):
    notes = (rendered / "README.txt").read_text()
    for value in PLACEHOLDERS.values():
        assert value in notes
    init = (rendered / "hosts/labs-k8s-m01/steps/kubeadm-init/kubeadm-init.yaml").read_text()
    assert PLACEHOLDERS["bootstrap token"] in init


def test_render_reports_a_bad_config_without_a_traceback(tmp_path):
    stack = REPO_ROOT / "Pulumi.broken-test.yaml"
    text = (REPO_ROOT / "Pulumi.labs.yaml").read_text().replace("vip: 10.3.60.100", "vip: 10.3.60.51")
    stack.write_text(text)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "components", "render", "--stack", "broken-test", "--out", str(tmp_path)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        stack.unlink()
    assert result.returncode == 2
    assert "labs-k8s:loadBalancer.vip" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "plan.json").exists()
