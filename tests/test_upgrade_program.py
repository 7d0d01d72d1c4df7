"""Kubernetes upgrades in the config and the program: what config validation refuses, and (under the
mock engine) the upgrade chain of the graph."""

from __future__ import annotations

import itertools
from typing import Any

import pulumi
import pytest

from components.config import load_lab_config
from components.rendering import bundle_files
from components.tools.changes import plan_changes
from components.tools.offline import OfflineRun, RecordingMonitor, run_program
from components.upgrade import (
    VersionRecords,
    recorded_containerd,
    recorded_version,
    records_from,
    rolling_upgrade,
    version_problems,
)
from tests.labs import make_lab_config, namespace
from tests.test_config import problems


@pytest.mark.parametrize("version", ["1.29.9", "1.38.0"])
def test_a_version_outside_the_supported_window_is_refused_before_anything(
    lab_namespace: dict[str, Any], version: str
) -> None:
    lab_namespace["kubernetes"]["version"] = version
    assert "not supported; use a release of minors 1.30-1.37" in problems(lab_namespace)["kubernetes.version"]


@pytest.mark.parametrize(
    ("workers", "at_once", "accepted"),
    [
        (2, 1, True),
        (2, 2, False),
        (2, 0, False),
        (5, 4, True),
        (5, 5, False),
        (1, 1, True),
    ],
)
def test_workers_at_once_leaves_a_worker_for_the_workloads(
    lab_namespace: dict[str, Any], workers: int, at_once: int, accepted: bool
) -> None:
    lab_namespace["nodes"]["workers"]["hosts"] = [
        {"name": f"labs-k8s-w{i:02}", "ip": f"10.3.60.{60 + i}"} for i in range(1, workers + 1)
    ]
    lab_namespace["kubernetes"]["upgrade"] = {"workersAtOnce": at_once}
    if workers == 1:  # a lone worker is refused unless asked for (test_config.py), whatever workersAtOnce says
        lab_namespace["kubernetes"]["allowSingleWorker"] = True
    if accepted:
        assert load_lab_config(lab_namespace).kubernetes.upgrade.workers_at_once == at_once
    else:
        message = problems(lab_namespace)["kubernetes.upgrade.workersAtOnce"]
        assert f"use 1 to {max(1, workers - 1)}" in message and "somewhere to run" in message


def test_workers_at_once_defaults_to_one(lab_config) -> None:
    assert lab_config.kubernetes.upgrade.workers_at_once == 1


# --------------------------------------------------------------------------- the last deployment's records

NAMES = ("labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03", "labs-k8s-w01", "labs-k8s-w02")


def records(containerd: str | None = "2.2.1", **versions: str | None) -> VersionRecords:
    with_containerd = f", containerd {containerd}" if containerd else ""
    stdouts = {
        f"{name}-upgrade": (
            f"{name} already at {versions.get(name[-3:], 'v1.35.2')}{with_containerd}"
            if versions.get(name[-3:], "v1.35.2")
            else None
        )
        for name in NAMES
    }
    return records_from(True, list(NAMES), stdouts.get)


def test_the_upgrade_steps_stdout_is_the_record() -> None:
    assert recorded_version("labs-k8s-m01 already at v1.36.0, containerd 2.2.1\n") == (1, 36, 0)
    assert recorded_version("labs-k8s-m01 upgraded to v1.36.2, containerd 2.2.1; etcd snapshot /x.db") == (1, 36, 2)
    assert recorded_version("prepared labs-k8s-m01") is None and recorded_version(None) is None
    assert recorded_containerd("labs-k8s-m01 upgraded to v1.36.2, containerd 2.2.1; etcd snapshot /x.db") == "2.2.1"
    assert recorded_containerd("labs-k8s-w01 already at v1.36.0, containerd 2.1.5\n") == "2.1.5"
    assert recorded_containerd("labs-k8s-m01 already at v1.36.0") is None, "a record from before containerd was in it"


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("1.35.2", None),
        ("1.35.4", None),
        ("1.36.0", None),
        ("1.35.0", "older than v1.35.2, which labs-k8s-m01 already runs"),
        ("1.34.3", "downgrades are not supported"),
        (
            "1.37.0",
            "1.37.0 skips a minor: the cluster runs v1.35.2 and kubeadm upgrades one minor at a time; "
            "set a 1.36.x release",
        ),
    ],
)
def test_config_validation_refuses_what_the_records_rule_out(version: str, problem: str | None) -> None:
    found = version_problems(make_lab_config(kubernetes={"version": version}), records())
    if problem is None:
        assert found == []
    else:
        assert [p.key for p in found] == ["kubernetes.version"] and problem in found[0].message
        assert str(found[0]).startswith("labs-k8s:kubernetes.version: ")


def test_an_unfinished_upgrade_is_finished_before_the_next_minor() -> None:
    half = records(m01="v1.36.0", m02="v1.36.0")
    assert version_problems(make_lab_config(kubernetes={"version": "1.36.0"}), half) == []
    found = version_problems(make_lab_config(kubernetes={"version": "1.37.0"}), half)
    assert "labs-k8s-m03 is still at v1.35.2: the upgrade to v1.36.0 did not finish" in found[0].message
    downgrade = version_problems(make_lab_config(kubernetes={"version": "1.35.2"}), half)
    assert "older than v1.36.0, which labs-k8s-m01 already runs" in downgrade[0].message


def test_no_records_no_refusal_here() -> None:
    """Without records (an unreadable state, a lab from before upgrade steps) the first control
    plane's own check against the running cluster is what refuses."""
    lab = make_lab_config(kubernetes={"version": "1.37.0"})
    assert version_problems(lab, VersionRecords(known=False)) == []
    assert version_problems(lab, records(m01=None, m02=None, m03=None, w01=None, w02=None)) == []


def test_the_chain_is_serialized_unless_every_node_is_proven_at_the_version() -> None:
    lab = make_lab_config(kubernetes={"version": "1.35.2"})
    assert rolling_upgrade(lab, records()) is False, "same version: the steps are no-ops, in parallel"
    assert rolling_upgrade(lab, VersionRecords(known=True, fresh=True)) is False, "creation"
    assert rolling_upgrade(make_lab_config(kubernetes={"version": "1.36.0"}), records()) is True
    assert rolling_upgrade(lab, records(w02="v1.35.0")) is True
    assert rolling_upgrade(lab, records(w01=None)) is True, "a node without a record proves nothing"
    assert rolling_upgrade(lab, VersionRecords(known=False)) is True, "an unreadable state proves nothing"


def test_a_containerd_change_alone_serializes_the_chain() -> None:
    """labs-k8s:kubernetes.containerdVersion is rolled by the upgrade steps, drained, node by node."""
    lab = make_lab_config(kubernetes={"version": "1.35.2"})
    assert rolling_upgrade(lab, records(containerd="2.2.1")) is False
    assert rolling_upgrade(lab, records(containerd="2.1.5")) is True, "a new pin: the chain"
    assert rolling_upgrade(lab, records(containerd=None)) is True, "a record without containerd proves nothing"


# --------------------------------------------------------------------------- the program under the mock engine


def bundle_params(reg: Any) -> str:
    """The params.env a step's bundle writes."""
    params = bundle_files(reg.plain_inputs["stdin"]).get("params.env")
    assert params is not None, reg.name
    return params


CHAIN = [
    "labs-k8s-m01-upgrade",
    "labs-k8s-m02-upgrade",
    "labs-k8s-m03-upgrade",
    "labs-k8s-w01-upgrade-drain",
    "labs-k8s-w01-upgrade",
    "labs-k8s-w01-upgrade-uncordon",
    "labs-k8s-w02-upgrade-drain",
    "labs-k8s-w02-upgrade",
    "labs-k8s-w02-upgrade-uncordon",
]


def version(value: str) -> dict[str, Any]:
    return {"labs-k8s:kubernetes": {**namespace()["kubernetes"], "version": value}}


@pytest.fixture(scope="module")
def runs() -> dict[str, OfflineRun]:
    """A lab created at 1.35.2; the same stack moved to 1.36.0; then `pulumi up` again at 1.36.0.
    Each run reads the one before it as its previous state, as the engine's checkpoint would give it."""
    created = run_program("labs", overrides=version("1.35.2"))
    upgraded = run_program("labs", overrides=version("1.36.0"), previous=created.previous_state())
    again = run_program("labs", overrides=version("1.36.0"), previous=upgraded.previous_state())
    return {"created": created, "upgraded": upgraded, "again": again}


# Every step's connection pins its node's host key, made from a RandomId seed (#30): that seed is data
# the step reads, not a step it waits for, so the ordering checks below leave the seeds out.
# Every step through the VIP also waits for the control planes' host-key steps (the shared key in
# place on all of them: remote.HostPins.cluster_presented, tests/test_program.py): not part of the
# upgrade chain, so left out below as well; and so are the control planes' prepare steps, which
# install the step library every step through the VIP copies (remote.RemoteSteps.prepare).
SEEDS = ("-host-key-seed", "step-trigger-key", "-host-key", "-prepare")


def direct(run: OfflineRun, name: str) -> set[str]:
    """The steps a step waits for in the upgrade chain: its direct dependencies without the host
    key seeds, host-key steps and prepare steps."""
    names = {urn.rsplit("::", 1)[-1] for urn in run.by_name(name).dependencies}
    return {n for n in names if not n.endswith(SEEDS)}


def test_at_creation_the_upgrade_steps_are_no_ops_beside_their_node(runs: dict[str, OfflineRun]) -> None:
    run = runs["created"]
    for step in CHAIN:
        reg = run.by_name(step)
        assert "K8S_VERSION=1.35.2" in bundle_params(reg), step
    assert direct(run, "labs-k8s-m02-upgrade") == {"labs-k8s-m02-kubeadm-join"}
    assert direct(run, "labs-k8s-w02-upgrade-drain") == {"labs-k8s-w02-kubeadm-join"}
    # Workers join beside the control planes, not after an upgrade chain: the graph stays shallow.
    assert not run.depends_on("labs-k8s-w01-kubeadm-join", "labs-k8s-m03-upgrade")
    assert not run.depends_on("labs-k8s-w02-upgrade-drain", "labs-k8s-w01-upgrade-uncordon")
    assert not run.depends_on("labs-k8s-m02-refresh-join-material", "labs-k8s-m01-upgrade")


def test_a_new_version_runs_kubeadms_chain_in_order(runs: dict[str, OfflineRun]) -> None:
    run = runs["upgraded"]
    for earlier, later in itertools.pairwise(CHAIN):
        assert run.depends_on(later, earlier), (later, earlier)
    # Each control plane's upgrade before the next one's join; workers (and their joins) after the last.
    assert direct(run, "labs-k8s-m02-refresh-join-material") >= {"labs-k8s-m01-upgrade"}
    assert direct(run, "labs-k8s-w01-upgrade-drain") == {"labs-k8s-w01-kubeadm-join", "labs-k8s-m03-upgrade"}
    assert direct(run, "labs-k8s-w02-upgrade-drain") == {"labs-k8s-w02-kubeadm-join", "labs-k8s-w01-upgrade-uncordon"}
    for worker in ("labs-k8s-w01", "labs-k8s-w02"):
        assert run.depends_on(f"{worker}-kubeadm-join", "labs-k8s-m03-upgrade")
    for control_plane in CHAIN[:3]:
        for worker_step in CHAIN[3:]:
            assert not run.depends_on(control_plane, worker_step)
    # Verified at the end; the kubeconfig re-exported once the control planes renewed their certificates.
    for step in CHAIN:
        assert run.depends_on("verify-cluster", step)
    assert "KUBERNETES_VERSION=v1.36.0" in bundle_params(run.by_name("verify-cluster"))
    assert "labs-k8s-m03-upgrade" in direct(run, "kubeconfig")
    assert "kubernetes:1.36.0" in run.by_name("kubeconfig").plain_inputs["triggers"]
    # Where each step runs: a control plane's on itself, a worker's drain and uncordon on any healthy
    # control plane (the VIP's SSH port), its upgrade on the worker.
    hosts = {name: run.by_name(name).plain_inputs["connection"]["host"] for name in CHAIN}
    assert hosts["labs-k8s-m02-upgrade"] == "10.3.60.52" and hosts["labs-k8s-w01-upgrade"] == "10.3.60.54"
    assert hosts["labs-k8s-w01-upgrade-drain"] == hosts["labs-k8s-w01-upgrade-uncordon"] == "10.3.60.100"


def test_the_same_version_again_changes_no_input(runs: dict[str, OfflineRun]) -> None:
    """`pulumi up` with no change after an upgrade: not one resource has another input, so nothing runs."""
    upgraded, again = runs["upgraded"], runs["again"]
    assert {r.name for r in again.registrations.values()} == {r.name for r in upgraded.registrations.values()}
    changed = [
        r.name
        for r in again.registrations.values()
        if r.custom and r.plain_inputs != upgraded.by_name(r.name).plain_inputs
    ]
    assert changed == []
    # ... and the chain is no longer serialized: every node is recorded at 1.36.0.
    assert direct(again, "labs-k8s-w02-upgrade-drain") == {"labs-k8s-w02-kubeadm-join"}


def test_a_new_version_changes_the_chain_and_what_must_follow(runs: dict[str, OfflineRun]) -> None:
    plan = plan_changes(runs["created"], runs["upgraded"])
    replaced = [e.name for e in plan.effects if e.action == "replace"]
    assert [e for e in plan.effects if e.action != "replace"] == [] or all(
        e.action == "delete" for e in plan.effects if e.action != "replace"
    )
    # The chain, in the order the engine runs it.
    assert [name for name in replaced if name in CHAIN] == CHAIN
    # What carries the version in its files (prepare, init, refresh: they find their node done),
    # the joins after them, the final verification and the re-export of the kubeconfig.
    assert set(replaced) - set(CHAIN) == {
        *(f"labs-k8s-{n}-prepare" for n in ("m01", "m02", "m03", "w01", "w02")),
        "labs-k8s-m01-kubeadm-init",
        *(f"labs-k8s-{n}-refresh-join-material" for n in ("m01", "m02", "m03", "w01", "w02")),
        *(f"labs-k8s-{n}-kubeadm-join" for n in ("m01", "m02", "m03", "w01", "w02")),
        "verify-cluster",
        "kubeconfig",
    }  # not Flannel: init's re-run only orders it (order_after), and its manifest has no version
    assert plan.effect("labs-k8s-m01-upgrade").inputs == ("triggers", "stdin")  # type: ignore[union-attr]


def test_a_resumed_upgrade_keeps_the_chain_and_leaves_the_done_nodes_alone(runs: dict[str, OfflineRun]) -> None:
    """The last `up` stopped at m02: its state still holds m02's old step (the new one failed)."""
    state = runs["upgraded"].previous_state()
    for urn, entry in state.items():
        if urn.endswith("::labs-k8s-m02-upgrade"):
            entry["outputs"]["stdout"] = "labs-k8s-m02 already at v1.35.2"
    resumed = run_program("labs", overrides=version("1.36.0"), previous=state)
    assert resumed.depends_on("labs-k8s-w01-upgrade-drain", "labs-k8s-m02-upgrade")
    assert (
        resumed.by_name("labs-k8s-m01-upgrade").plain_inputs
        == runs["upgraded"].by_name("labs-k8s-m01-upgrade").plain_inputs
    ), "m01 is done: its step does not run again"


def containerd(value: str) -> dict[str, Any]:
    return {"labs-k8s:kubernetes": {**namespace()["kubernetes"], "version": "1.35.2", "containerdVersion": value}}


@pytest.fixture(scope="module")
def containerd_runs(runs: dict[str, OfflineRun]) -> dict[str, OfflineRun]:
    """The lab created at 1.35.2 (containerd 2.2.1), moved to containerd 2.1.5 alone, then `up` again."""
    rolled = run_program("labs", overrides=containerd("2.1.5"), previous=runs["created"].previous_state())
    again = run_program("labs", overrides=containerd("2.1.5"), previous=rolled.previous_state())
    return {"rolled": rolled, "again": again}


def test_a_containerd_change_alone_rolls_through_the_chain(
    runs: dict[str, OfflineRun], containerd_runs: dict[str, OfflineRun]
) -> None:
    """A new containerd pin re-runs every upgrade step, serialized as for a new Kubernetes version: one
    control plane at a time, the workers drained one lane at a time (prepare-node.sh leaves containerd
    alone on a joined node)."""
    run = containerd_runs["rolled"]
    for earlier, later in itertools.pairwise(CHAIN):
        assert run.depends_on(later, earlier), (later, earlier)
    assert direct(run, "labs-k8s-w02-upgrade-drain") == {"labs-k8s-w02-kubeadm-join", "labs-k8s-w01-upgrade-uncordon"}
    for step in CHAIN:
        assert "CONTAINERD_VERSION=2.1.5" in bundle_params(run.by_name(step)), step
    replaced = [e.name for e in plan_changes(runs["created"], run).effects if e.action == "replace"]
    assert [name for name in replaced if name in CHAIN] == CHAIN


def test_the_same_containerd_again_changes_no_input(containerd_runs: dict[str, OfflineRun]) -> None:
    rolled, again = containerd_runs["rolled"], containerd_runs["again"]
    changed = [
        r.name
        for r in again.registrations.values()
        if r.custom and r.plain_inputs != rolled.by_name(r.name).plain_inputs
    ]
    assert changed == []
    assert direct(again, "labs-k8s-w02-upgrade-drain") == {"labs-k8s-w02-kubeadm-join"}, "no longer serialized"


def test_workers_at_once_gives_lanes_in_the_graph() -> None:
    nodes = namespace()["nodes"]
    nodes["workers"]["hosts"] = [{"name": f"labs-k8s-w{i:02}", "ip": f"10.3.60.{60 + i}"} for i in range(1, 5)]
    overrides = {"labs-k8s:nodes": nodes}
    created = run_program("labs", overrides={**overrides, **version("1.35.2")})
    kubernetes = {**version("1.36.0")["labs-k8s:kubernetes"], "upgrade": {"workersAtOnce": 2}}
    run = run_program(
        "labs", overrides={**overrides, "labs-k8s:kubernetes": kubernetes}, previous=created.previous_state()
    )
    assert direct(run, "labs-k8s-w01-upgrade-drain") >= {"labs-k8s-m03-upgrade"}
    assert direct(run, "labs-k8s-w02-upgrade-drain") >= {"labs-k8s-m03-upgrade"}
    assert direct(run, "labs-k8s-w03-upgrade-drain") >= {"labs-k8s-w01-upgrade-uncordon"}
    assert direct(run, "labs-k8s-w04-upgrade-drain") >= {"labs-k8s-w02-upgrade-uncordon"}
    assert not run.depends_on("labs-k8s-w02-upgrade-drain", "labs-k8s-w01-upgrade")


def test_a_node_added_during_a_minor_upgrade_joins_after_the_control_planes(runs: dict[str, OfflineRun]) -> None:
    nodes = namespace()["nodes"]
    nodes["workers"]["hosts"].append({"name": "labs-k8s-w03", "ip": "10.3.60.57"})
    run = run_program(
        "labs", overrides={"labs-k8s:nodes": nodes, **version("1.36.0")}, previous=runs["created"].previous_state()
    )
    assert "K8S_VERSION=1.36.0" in bundle_params(run.by_name("labs-k8s-w03-prepare"))
    assert run.depends_on("labs-k8s-w03-kubeadm-join", "labs-k8s-m03-upgrade")


def test_a_minor_the_pinned_containerd_cannot_run_is_refused_before_anything() -> None:
    """1.35 runs on containerd 1.7; moving to 1.36 without raising the pin is refused in validation."""
    pinned = {**namespace()["kubernetes"], "version": "1.35.2", "containerdVersion": "1.7.28"}
    previous = run_program("labs", overrides={"labs-k8s:kubernetes": pinned}).previous_state()
    monitors: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run_program(
            "labs",
            overrides={"labs-k8s:kubernetes": {**pinned, "version": "1.36.0"}},
            previous=previous,
            monitor_sink=monitors,
        )
    assert (
        "labs-k8s:kubernetes.containerdVersion: containerd 1.7.28 is too old for Kubernetes 1.36.0 "
        "(labs-k8s:kubernetes.version)"
    ) in str(caught.value)
    assert monitors[0].registrations == {}


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        ("1.36.0", "1.35.2", "1.35.2 is older than v1.36.0, which labs-k8s-m01 already runs"),
        ("1.35.2", "1.37.0", "1.37.0 skips a minor: the cluster runs v1.35.2"),
    ],
)
def test_a_bad_version_change_registers_nothing(before: str, after: str, message: str) -> None:
    previous = run_program("labs", overrides=version(before)).previous_state()
    monitors: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run_program("labs", overrides=version(after), previous=previous, monitor_sink=monitors)
    assert f"labs-k8s:kubernetes.version: {message}" in str(caught.value)
    assert monitors[0].registrations == {}
