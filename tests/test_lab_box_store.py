"""The lab in a box's cluster store outlives no cluster (tests/lab_box.py forget_cluster_without_members),
and `make test` runs the box on a worker of its own (tests/conftest.py).

The bench's second `make up` after `make destroy` hung in kubeadm init: the stand-ins' shared store
still listed the destroyed control planes as etcd members, and the new first member's etcd waited
for them ("no member with peer URL https://10.3.60.51:2380 and this data dir in the cluster").
On vCenter the VMs' disks, and with them etcd's data, go with `make destroy`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BoxBesideTheSuite
from tests.kube_standin import empty_state
from tests.lab_box import LabBox, NodeHost, forget_cluster_without_members

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
CONTROL_PLANES = ("labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03")


def a_store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    (store / "pki").mkdir(parents=True)
    (store / "pki" / "ca.crt").write_text("the cluster CA\n")
    state: dict[str, Any] = {
        **empty_state(),
        "hosts": {
            name: {"ip": f"10.3.60.{51 + i}", "role": "control-plane", "up": True}
            for i, name in enumerate(CONTROL_PLANES)
        }
        | {"labs-k8s-w01": {"ip": "10.3.60.54", "role": "worker", "up": True}},
        "balancers": {"labs-k8s-lb01": {"holds_vip": True}, "labs-k8s-lb02": {"holds_vip": False}},
        "members": [
            {"id": 100 + i, "name": name, "peer": f"https://10.3.60.{51 + i}:2380", "data": f"d{i}", "learner": False}
            for i, name in enumerate(CONTROL_PLANES)
        ],
        "nodes": {"labs-k8s-m01": {"labels": {}}, "labs-k8s-w01": {"labels": {}}},
        "objects": {"configmap/kube-public/cluster-info": {}},
        "die": {"labs-k8s-w03": {"join": "kubelet-start/written"}},
        "node_grace_s": 50.0,
    }
    (store / "cluster.json").write_text(json.dumps(state))
    return store


def read(store: Path) -> dict[str, Any]:
    return dict(json.loads((store / "cluster.json").read_text()))


def test_a_store_whose_members_have_a_vm_left_is_kept(tmp_path: Path) -> None:
    store = a_store(tmp_path)
    before = read(store)
    # m03 replaced (its old VM gone), a worker removed: m01 and m02 still hold etcd's data.
    assert forget_cluster_without_members(store, {"labs-k8s-m01", "labs-k8s-m02", "labs-k8s-lb01"}) is None
    assert read(store) == before and (store / "pki" / "ca.crt").is_file()


def test_the_last_members_vm_gone_takes_the_cluster_and_keeps_the_machines(tmp_path: Path) -> None:
    store = a_store(tmp_path)
    before = read(store)
    forgotten = forget_cluster_without_members(store, {"labs-k8s-w01", "labs-k8s-lb01"})
    assert forgotten == before
    after = read(store)
    assert after["members"] == [] and after["nodes"] == {} and after["objects"] == {}, after
    assert not (store / "pki").exists()  # a new kubeadm init makes a new cluster CA
    # What is not etcd's: the machines still there, the VIP, the tests' plans.
    assert sorted(after["hosts"]) == ["labs-k8s-w01"] and sorted(after["balancers"]) == ["labs-k8s-lb01"]
    assert after["vip"] == before["vip"] and after["die"] == before["die"] and after["node_grace_s"] == 50.0


def test_a_store_before_the_first_member_is_kept(tmp_path: Path) -> None:
    store = a_store(tmp_path)
    state = read(store) | {"members": []}
    (store / "cluster.json").write_text(json.dumps(state))
    assert forget_cluster_without_members(store, set()) is None
    assert read(store) == state
    empty = tmp_path / "empty"  # no command has run yet: no cluster.json
    empty.mkdir()
    assert forget_cluster_without_members(empty, set()) is None
    assert not (empty / "cluster.json").exists()


def test_make_tests_two_workers_run_the_box_beside_the_rest() -> None:
    """xdist's own `--dist loadgroup` rewrote `item._nodeid`, which pytest 9 ignores: both workers
    ran the box at once. The suite's scheduler makes exactly two work units, so each worker gets one."""
    scheduler = object.__new__(BoxBesideTheSuite)  # only its split is asked: no workers needed
    scopes = {
        scheduler._split_scope(nodeid)
        for nodeid in (
            "tests/test_lab_box.py::test_make_destroy_empties_vcenter_and_the_box",
            "tests/test_lab_box.py::test_the_seeds_failure_drills_pass_against_the_box[worker]",
            "tests/test_lab_box_store.py::test_a_store_before_the_first_member_is_kept",
            "tests/test_docs.py::test_local_links_resolve[testing.md]",
            "tests/test_real_engine.py::test_the_template_layer_on_the_real_engine",
        )
    }
    assert scopes == {"box", "suite"}
    assert scheduler._split_scope("tests/test_lab_box.py::test_x") == "box"
    assert scheduler._split_scope("tests/test_lab_box_store.py::test_x") == "suite"
    assert "-n 2" in next(line for line in MAKEFILE.read_text().splitlines() if "-m pytest" in line)


def test_who_sees_the_last_vm_gone_sees_the_cluster_it_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI ran `make destroy` in the box, saw no host left and read no forgotten cluster: the host
    left `hosts` first, and the cluster was forgotten after its logs were copied and its disk
    removed. A reader that sees the host gone, even without the lock, sees what its disk took."""
    box = object.__new__(LabBox)  # no network namespace: only the removal is asked
    box.root, box.hosts, box.lock, box.forgotten_clusters = tmp_path / "box", {}, threading.Lock(), []
    box.root.mkdir()
    a_store(tmp_path).rename(box.store)
    for i, name in enumerate(CONTROL_PLANES):
        box.hosts[f"vm-{i}"] = NodeHost(f"u{i}", name, "", f"vm-{i}", {}, tmp_path / name, "", "")
    monkeypatch.setattr(LabBox, "keep_logs", lambda self, host: time.sleep(0.3))  # a copy that takes time
    for host in list(box.hosts.values())[:-1]:
        box.forget(host)
    last = next(iter(box.hosts.values()))
    removal = threading.Thread(target=box.forget, args=(last,))
    removal.start()
    deadline = time.monotonic() + 10
    while box.hosts and time.monotonic() < deadline:  # no lock, as the destroy stage read it
        time.sleep(0.01)
    seen = list(box.forgotten_clusters)
    removal.join()
    assert len(seen) == 1 and {m["name"] for m in seen[0]["members"]} == set(CONTROL_PLANES), seen
    assert not box.hosts and box.names() == []
