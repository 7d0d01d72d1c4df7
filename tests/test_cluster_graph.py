"""What the program decides from its previous state, under the mock engine.

Each test runs the real program twice: once to produce a "previous deployment" (the state
`pulumi:pulumi:readStackOutputs` and `readStackResourceOutputs` return, components/previous_state.py),
then again with a config change or a changed state, and compares what each resource would receive.
The mock answers as the engine does (components/tools/offline.py LabMocks): a self-managed stack with no
deployment has no outputs, and asking it for its resources kills the run (EnginePanic).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pulumi
import pytest

from components import previous_state
from components.previous_state import (
    INITIAL_DEPLOYMENT_OUTPUT,
    READ_STACK_OUTPUTS,
    READ_STACK_RESOURCE_OUTPUTS,
    UNREADABLE_KEY,
)
from components.tools.offline import EnginePanic, InvokeFailed, LabMocks, OfflineRun, RecordingMonitor, run_program

STACK_URN = "urn:pulumi:labs::labs-k8s::pulumi:pulumi:Stack::labs-k8s-labs"
CLOUD_ORGANIZATION = "my-org"


def run(
    namespace: dict[str, Any] | None = None,
    previous: dict[str, Any] | None = None,
    sink: list[RecordingMonitor] | None = None,
    organization: str = "organization",
) -> OfflineRun:
    overrides = {f"labs-k8s:{k}": v for k, v in (namespace or {}).items()}
    return run_program("labs", overrides=overrides, previous=previous, monitor_sink=sink, organization=organization)


def state_tokens(run: OfflineRun) -> list[str]:
    return [token for token, _ in run.calls if token.startswith("pulumi:pulumi:read")]


def changed_inputs(before: OfflineRun, after: OfflineRun) -> set[str]:
    return {
        reg.name
        for reg in before.registrations.values()
        if reg.custom
        and reg.name in {r.name for r in after.registrations.values()}
        and reg.plain_inputs != after.by_name(reg.name).plain_inputs
    }


def without(state: dict[str, Any], name: str) -> dict[str, Any]:
    return {urn: entry for urn, entry in state.items() if not urn.endswith(f"::{name}")}


def edited(state: dict[str, Any], name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    copy = {urn: {"type": e["type"], "outputs": dict(e["outputs"])} for urn, e in state.items()}
    for urn, entry in copy.items():
        if urn.endswith(f"::{name}"):
            change(entry["outputs"])
    return copy


def control_planes(lab_namespace: dict[str, Any], count: int, first: int = 1) -> dict[str, Any]:
    nodes = lab_namespace["nodes"]
    nodes["controlPlanes"]["hosts"] = [
        {"name": f"labs-k8s-m0{i}", "ip": f"10.3.60.{60 + i}"} for i in range(first, first + count)
    ]
    return nodes


def test_the_program_reads_its_previous_state_before_registering_anything(offline_run: OfflineRun) -> None:
    again = run(previous=offline_run.previous_state())
    assert again.calls[:2] == [
        (READ_STACK_OUTPUTS, {"name": "organization/labs-k8s/labs"}),
        (READ_STACK_RESOURCE_OUTPUTS, {"stackName": "organization/labs-k8s/labs"}),
    ]


def test_the_mock_engine_dies_like_the_cli_on_a_new_self_managed_stack() -> None:
    """The model the next test stands on: pkg/backend/backend.go GetStackResourceOutputs panics on
    the nil snapshot of a stack `pulumi stack init` made on a self-managed backend; Pulumi Cloud
    answers an empty deployment; readStackOutputs is nil-safe on both."""

    def program() -> None:
        pulumi.runtime.invoke(READ_STACK_OUTPUTS, {"name": "organization/labs-k8s/labs"})
        with contextlib.suppress(Exception):  # what a program that catches everything would do
            pulumi.runtime.invoke(READ_STACK_RESOURCE_OUTPUTS, {"stackName": "organization/labs-k8s/labs"})

    with pytest.raises(EnginePanic):
        run_program("labs", program=program, previous=None)
    assert run_program("labs", program=program, previous=None, organization=CLOUD_ORGANIZATION)
    assert run_program("labs", program=program, previous={})


@pytest.mark.parametrize("preview", [True, False], ids=["preview", "up"])
def test_a_new_self_managed_stack_is_never_asked_for_its_resources(preview: bool) -> None:
    """The README's self-managed path: `pulumi stack init`, then the first preview or up."""
    first = run_program("labs", previous=None, preview=preview)
    assert state_tokens(first) == [READ_STACK_OUTPUTS]
    assert first.by_name("labs-k8s-m02-refresh-join-material")


def failed_first_up(state: dict[str, Any], stack_outputs: dict[str, Any]) -> dict[str, Any]:
    """A first `up` that created the VMs and m01, then failed at m02's join: no program output
    was registered, the stack resource has only what it had before."""
    failed = {urn: entry for urn, entry in state.items() if entry["type"] != "pulumi:pulumi:Stack"}
    failed = without(
        without(without(failed, "labs-k8s-m02-kubeadm-join"), "labs-k8s-m03-kubeadm-join"), "verify-cluster"
    )
    failed[STACK_URN] = {"type": "pulumi:pulumi:Stack", "outputs": stack_outputs}
    return failed


@pytest.mark.parametrize(
    ("organization", "stack_outputs"),
    [
        ("organization", {INITIAL_DEPLOYMENT_OUTPUT: "make up"}),
        (CLOUD_ORGANIZATION, {}),
    ],
    ids=["self-managed-made-by-make-up", "pulumi-cloud"],
)
def test_a_first_up_that_failed_before_any_output_still_retries_with_fresh_join_material(
    offline_run: OfflineRun, organization: str, stack_outputs: dict[str, Any]
) -> None:
    failed = failed_first_up(offline_run.previous_state(), stack_outputs)
    retry = run(previous=failed, organization=organization)
    assert state_tokens(retry) == [READ_STACK_OUTPUTS, READ_STACK_RESOURCE_OUTPUTS]
    assert "join-attempt:2" in retry.by_name("labs-k8s-m02-refresh-join-material").plain_inputs["triggers"]
    assert "join-attempt:1" in retry.by_name("labs-k8s-m01-refresh-join-material").plain_inputs["triggers"]
    assert not retry.stack_outputs.get("labsK8sInitialDeployment")  # the program's outputs replace it


def test_a_self_managed_stack_without_outputs_is_read_as_new(offline_run: OfflineRun) -> None:
    """A bare `pulumi stack init` + failed `pulumi up` (not `make up`) cannot be told from a new
    stack: read as one, never with readStackResourceOutputs (components/previous_state.py)."""
    retry = run(previous=failed_first_up(offline_run.previous_state(), {}))
    assert state_tokens(retry) == [READ_STACK_OUTPUTS]
    assert "join-attempt:1" in retry.by_name("labs-k8s-m02-refresh-join-material").plain_inputs["triggers"]


@pytest.fixture
def unreadable_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: LabMocks, name: str) -> dict[str, Any]:
        raise InvokeFailed(
            READ_STACK_OUTPUTS,
            'failed to load checkpoint: blob (key ".pulumi/stacks/labs-k8s/labs.json"): AccessDenied',
        )

    monkeypatch.setattr(LabMocks, "_read_stack_outputs", refuse)


@pytest.mark.usefixtures("unreadable_backend")
def test_an_unreadable_state_stops_the_run_before_anything_is_registered(offline_run: OfflineRun) -> None:
    sink: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run(previous=offline_run.previous_state(), sink=sink)
    message = str(caught.value)
    assert "AccessDenied" in message and "join-material" in message
    assert f"--path {UNREADABLE_KEY} ignore" in message and "pulumi config rm" in message
    assert sink[0].registrations == {}


def torn_reads(monkeypatch: pytest.MonkeyPatch, count: int, message: str) -> list[str]:
    """The first `count` reads of the stack's outputs meet a checkpoint mid-save, as a file://
    backend's reader does while the engine rewrites `<stack>.json.attrs` in place (gocloud.dev
    blob/fileblob/attrs.go setAttrs); then the backend answers. Returns the names read."""
    monkeypatch.setattr(previous_state, "TORN_READ_DELAYS", (0.0,) * 5)
    answer = LabMocks._read_stack_outputs
    reads: list[str] = []

    def torn(self: LabMocks, name: str) -> dict[str, Any]:
        reads.append(name)
        if len(reads) <= count:
            raise InvokeFailed(READ_STACK_OUTPUTS, message)
        return answer(self, name)

    monkeypatch.setattr(LabMocks, "_read_stack_outputs", torn)
    return reads


@pytest.mark.parametrize("message", ["failed to load checkpoint: EOF", "failed to load checkpoint: unexpected EOF"])
def test_a_checkpoint_read_while_the_engine_saves_it_is_read_again(
    offline_run: OfflineRun, monkeypatch: pytest.MonkeyPatch, message: str
) -> None:
    """Seen on the real engine: a template-layer `up` of a new stack died in its first second with
    "failed to load checkpoint: EOF" (the engine was saving the root stack's step)."""
    reads = torn_reads(monkeypatch, 2, message)
    again = run(previous=offline_run.previous_state())
    assert len(reads) == 3
    assert changed_inputs(offline_run, again) == set()


def test_a_checkpoint_that_stays_torn_stops_the_run_after_the_last_read(
    offline_run: OfflineRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = torn_reads(monkeypatch, 99, "failed to load checkpoint: EOF")
    sink: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run(previous=offline_run.previous_state(), sink=sink)
    assert len(reads) == 1 + len(previous_state.TORN_READ_DELAYS)
    assert "failed to load checkpoint: EOF" in str(caught.value) and "pulumi config rm" in str(caught.value)
    assert sink[0].registrations == {}


def test_any_other_failure_is_not_read_again(offline_run: OfflineRun, monkeypatch: pytest.MonkeyPatch) -> None:
    denied = 'failed to load checkpoint: blob (key ".pulumi/stacks/labs.json"): AccessDenied'
    reads = torn_reads(monkeypatch, 99, denied)
    with pytest.raises(pulumi.RunError, match="AccessDenied"):
        run(previous=offline_run.previous_state())
    assert len(reads) == 1


@pytest.mark.usefixtures("unreadable_backend")
def test_the_override_key_goes_on_without_the_state(lab_namespace: dict[str, Any]) -> None:
    ignored = run({"previousState": {"unreadable": "ignore"}}, previous={})
    assert "join-attempt:1" in ignored.by_name("labs-k8s-m02-refresh-join-material").plain_inputs["triggers"]


def test_a_second_up_with_no_change_changes_nothing(offline_run: OfflineRun) -> None:
    again = run(previous=offline_run.previous_state())
    assert changed_inputs(offline_run, again) == set()


def test_a_join_retried_in_a_later_up_gets_fresh_join_material(offline_run: OfflineRun) -> None:
    """The last `up` ran m02's refresh but its join failed (not in the state): this `up` re-runs
    the refresh (the kubeadm-certs Secret is 2 h old at most then), and only what follows it,
    with a token of a new join generation (issue #30 §5: the token the failed attempt carried is
    worth nothing to the retry); verify-cluster deletes the new token's ID after the joins."""
    failed_join = without(offline_run.previous_state(), "labs-k8s-m02-kubeadm-join")
    retry = run(previous=failed_join)
    refresh = retry.by_name("labs-k8s-m02-refresh-join-material")
    assert "join-attempt:2" in refresh.plain_inputs["triggers"]
    assert "join-attempt:1" in offline_run.by_name("labs-k8s-m02-refresh-join-material").plain_inputs["triggers"]
    fresh = {
        "labs-k8s-m02-join-token",
        "labs-k8s-m02-certificate-key",  # a control plane's, per join generation too (issue 50)
        "labs-k8s-m02-refresh-join-material",
        "labs-k8s-m02-kubeadm-join",
    }
    assert changed_inputs(offline_run, retry) == {*fresh, "verify-cluster"}
    token = retry.by_name("labs-k8s-m02-join-token")
    assert token.plain_inputs["keepers"]["joinAttempt"] == "join-attempt:2"
    assert token.plain_outputs["result"] != offline_run.by_name("labs-k8s-m02-join-token").plain_outputs["result"]

    # A join that left a failed state behind (stdout is not "joined") counts as pending too.
    partial = edited(offline_run.previous_state(), "labs-k8s-w01-kubeadm-join", lambda o: o.update(stdout=""))
    assert changed_inputs(offline_run, run(previous=partial)) == {
        "labs-k8s-w01-join-token",
        "labs-k8s-w01-refresh-join-material",
        "labs-k8s-w01-kubeadm-join",
        "verify-cluster",
    }

    # Once that join finished, the next `up` keeps the attempt number: no diff.
    done = retry.previous_state()
    assert changed_inputs(retry, run(previous=done)) == set()


@pytest.mark.parametrize(
    ("before", "after", "first_after"),
    [(3, 1, 1), (5, 1, 1), (5, 3, 4), (3, 3, 3)],
    ids=["3->1", "5->1", "5->3-three-replaced", "3-all-replaced"],
)
def test_a_change_that_would_drop_etcd_below_quorum_is_refused_before_anything_is_registered(
    lab_namespace: dict[str, Any], before: int, after: int, first_after: int
) -> None:
    previous = run({"nodes": control_planes(lab_namespace, before)}).previous_state()
    nodes = control_planes(lab_namespace, after, first=first_after)
    namespace = {"nodes": nodes}
    if after == 1:
        namespace["kubernetes"] = dict(lab_namespace["kubernetes"], allowSingleControlPlane=True)
    sink: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run(namespace, previous=previous, sink=sink)
    message = str(caught.value)
    assert "labs-k8s:nodes.controlPlanes.hosts" in message
    assert f"of the {before} control planes" in message and f"at least {before // 2 + 1} of them stay" in message
    assert sink[0].registrations == {}


@pytest.mark.parametrize(("before", "after"), [(5, 3), (3, 5), (1, 3)])
def test_changes_that_keep_a_quorum_are_accepted(lab_namespace: dict[str, Any], before: int, after: int) -> None:
    namespace: dict[str, Any] = {"nodes": control_planes(lab_namespace, before)}
    if before == 1:
        namespace["kubernetes"] = dict(lab_namespace["kubernetes"], allowSingleControlPlane=True)
    previous = run(namespace).previous_state()
    shrunk = run({"nodes": control_planes(lab_namespace, after)}, previous=previous)
    names = {r.name for r in shrunk.registrations.values()}
    assert {f"labs-k8s-m0{i}-kubeadm-join" for i in range(1, after + 1)} <= names
    if after < before:
        # The removed control planes' leave guards are not registered: the engine deletes them
        # (their deletes remove the etcd members) before their VMs, last one first.
        assert not {f"labs-k8s-m0{i}-leave-cluster" for i in range(after + 1, before + 1)} & names


def test_a_new_stack_skips_the_checks(lab_namespace: dict[str, Any]) -> None:
    assert run({"nodes": control_planes(lab_namespace, 3)}, previous={}).by_name("labs-k8s-m01-kubeadm-join")
    assert run({"nodes": control_planes(lab_namespace, 3)}, previous=None).by_name("labs-k8s-m01-kubeadm-join")


@pytest.mark.parametrize(("valid_until", "renewed"), [("2099-01-01T00:00:00Z", False), ("2000-01-01T00:00:00Z", True)])
def test_the_kubeconfig_is_re_exported_before_its_certificate_lapses(
    offline_run: OfflineRun, valid_until: str, renewed: bool
) -> None:
    assert offline_run.stack_outputs["kubeconfigValidUntil"] == "2099-01-01T00:00:00Z"
    previous = offline_run.previous_state()
    for entry in previous.values():
        if entry["type"] == "pulumi:pulumi:Stack":
            entry["outputs"]["kubeconfigValidUntil"] = valid_until
    again = run(previous=previous)
    assert changed_inputs(offline_run, again) == ({"kubeconfig"} if renewed else set())
    if renewed:
        assert "kubeconfig-renewal:2" in again.by_name("kubeconfig").plain_inputs["triggers"]


@pytest.mark.parametrize("preview", [True, False], ids=["preview", "up"])
def test_an_output_the_last_run_could_not_compute_reads_as_not_known(offline_run: OfflineRun, preview: bool) -> None:
    """After a targeted `up` the engine saves an output whose resource it skipped as its unknown
    placeholder, and the SDK reads it back as `pulumi.output.Unknown` (found on the real engine:
    every later run crashed in renewal_due with "'Unknown' object has no attribute 'replace'").
    The mock answers the invoke with the same wire value the engine sends (rpc.UNKNOWN); the SDK
    makes it `Unknown()` in a preview and None in an `up` (rpc.py deserialize_property)."""
    from pulumi.runtime.rpc import UNKNOWN

    previous = offline_run.previous_state()
    for entry in previous.values():
        if entry["type"] == "pulumi:pulumi:Stack":
            entry["outputs"]["kubeconfigValidUntil"] = UNKNOWN
    again = run_program("labs", previous=previous, preview=preview)
    assert again.by_name("kubeconfig")
    if not preview:
        assert changed_inputs(offline_run, again) == set()
